package restapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

// queueFixture is a project with a topic, a subscription, a processed, a
// leased and a pending message.
type queueFixture struct {
	p    testProject
	top  topicResp
	sub  subResp
	held claimResp
}

func (h *prjHarness) queueFixture() queueFixture {
	h.t.Helper()
	p := h.project()
	top := h.qTopic(p, "t")
	sub := h.qSub(p, top.ID, "s")
	for i := range 3 {
		h.qPublish(p, top.ID, fmt.Sprint(i), fmt.Sprintf(`{"i":%d}`, i))
	}
	done := h.qClaim(p, sub.ID, 1)[0]
	if code, b := h.qAck(p, sub.ID, done.Message.ID, done.Token, "processed", ""); code != 200 {
		h.t.Fatalf("ack: %d %s", code, b)
	}
	return queueFixture{p: p, top: top, sub: sub, held: h.qClaim(p, sub.ID, 1)[0]}
}

type queueReq struct{ method, path, body string }

// writes are every topic, subscription, claim and receipt write endpoint on
// the fixture.
func (f queueFixture) writes() []queueReq {
	return []queueReq{
		{"POST", "/topics", `{"name":"new"}`},
		{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"p","clientEventId":"new","payload":{"a":1}}`},
		{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"producer-1","clientEventId":"1","payload":{"i":1}}`},
		{"POST", "/subscriptions", fmt.Sprintf(`{"topicId":%q,"name":"n"}`, f.top.ID)},
		{"PATCH", "/subscriptions/" + f.sub.ID, `{"status":"paused"}`},
		{"POST", "/subscriptions/" + f.sub.ID + "/claim", `{"count":5}`},
		{"POST", "/subscriptions/" + f.sub.ID + "/receipts", fmt.Sprintf(`{"messageId":%q,"token":%q,"status":"processed"}`,
			f.held.Message.ID, f.held.Token)},
		{"POST", "/topics/" + f.top.ID + "/trim", `{}`},
		{"DELETE", "/subscriptions/" + f.sub.ID, ""},
		{"DELETE", "/topics/" + f.top.ID, ""},
	}
}

func (f queueFixture) reads() []queueReq {
	return []queueReq{
		{"GET", "", ""},
		{"GET", "/topics/" + f.top.ID + "/messages", ""},
		{"GET", "/subscriptions/" + f.sub.ID + "/receipts", ""},
	}
}

// dumpAll serialises every key of p and of the module budget so a test can
// prove a refused request wrote nothing. Keys of other projects are left
// out: on a shared server an earlier test's entries expire at any moment.
// So is the module's stamp of the last reservation naming a project: a
// write the project script refuses has reserved (and refunded) before.
func (h *prjHarness) dumpAll(p testProject) string {
	h.t.Helper()
	ctx := context.Background()
	var sb strings.Builder
	mk := project.NewModuleKeys(prjEnv)
	keys := append(h.keysUnder(p.keys.Prefix()), h.keysUnder(mk.Prefix())...)
	for _, k := range keys {
		if k == mk.Seen() {
			continue
		}
		if h.admin.Type(ctx, k).Val() == "set" {
			// A SET's DUMP follows its hash table's order, which a
			// no-op SADD may change: compare the members.
			m := h.admin.SMembers(ctx, k).Val()
			if len(m) == 0 {
				continue // gone since the scan (Redis keeps no empty set)
			}
			slices.Sort(m)
			fmt.Fprintf(&sb, "%s=%v;", k, m)
			continue
		}
		v, err := h.admin.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue // gone since the scan: absent, as the next scan will see it
		}
		if err != nil {
			h.t.Fatal(err)
		}
		fmt.Fprintf(&sb, "%s=%x;", k, v)
	}
	return sb.String()
}

func TestQueueWritesRefusedUnderUnsafeEvictionPolicy(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{EvictionPolicy: "volatile-lru"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newQueueHarness(t, project.QueueConfig{}, rs)
	f := h.queueFixture()
	ctx := context.Background()
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "allkeys-random"} {
		if err := h.admin.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		before := h.dumpAll(f.p)
		for _, r := range f.writes() {
			code, b := h.do(f.p.write, r.method, f.p.path(r.path), r.body)
			if code != 503 || string(b) != `{"error":"unsafe_eviction_policy"}` {
				t.Fatalf("%s %s %s under %s: %d %s", r.method, r.path, r.body, policy, code, b)
			}
		}
		if after := h.dumpAll(f.p); after != before {
			t.Fatalf("refused writes changed Redis under %s", policy)
		}
		for _, r := range f.reads() {
			if code, b := h.do(f.p.read, r.method, f.p.path(r.path), ""); code != 200 {
				t.Fatalf("read %s under %s: %d %s", r.path, policy, code, b)
			}
		}
	}
	h.admin.ConfigSet(ctx, "maxmemory-policy", "noeviction")
	testenv.Eventually(t, 5*time.Second, func() bool {
		code, _ := h.qClaimRaw(f.p.write, f.p, f.sub.ID, 1)
		return code == 200
	}, "writes did not resume under noeviction")
}

// Out of memory (noeviction): every write is refused up front with 503
// redis_oom and leaves nothing behind (the module reservation included);
// reads keep working; once memory is back, writes resume.
func TestQueueWritesRefusedUnderOOM(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "64mb", EvictionPolicy: "noeviction"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newQueueHarness(t, project.QueueConfig{}, rs)
	f := h.queueFixture()
	ctx := context.Background()
	if err := h.admin.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.admin.Set(ctx, "filler", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("the server is not out of memory: %v", err)
	}
	before := h.dumpAll(f.p)
	for _, r := range f.writes() {
		code, b := h.do(f.p.write, r.method, f.p.path(r.path), r.body)
		if code != 503 || string(b) != `{"error":"redis_oom"}` {
			t.Fatalf("%s %s %s under OOM: %d %s", r.method, r.path, r.body, code, b)
		}
	}
	if after := h.dumpAll(f.p); after != before {
		t.Fatal("refused writes changed Redis under OOM")
	}
	for _, r := range f.reads() {
		if code, b := h.do(f.p.read, r.method, f.p.path(r.path), ""); code != 200 {
			t.Fatalf("read %s under OOM: %d %s", r.path, code, b)
		}
	}
	if err := h.admin.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	if code, b := h.qAck(f.p, f.sub.ID, f.held.Message.ID, f.held.Token, "processed", ""); code != 200 {
		t.Fatalf("ack after OOM: %d %s", code, b)
	}
	h.qPublish(f.p, f.top.ID, "after", `{}`)
	h.assertModuleMatches(rs, f.p)
}

func TestQueueDataStateInvalid(t *testing.T) {
	// Leases long enough for the fixture's claim → ack under -race on a
	// loaded machine; one case waits for a lease to end.
	h := newQueueHarness(t, project.QueueConfig{Lease: time.Second}, nil)
	ctx := context.Background()
	metric := func() string {
		_, b := h.do("", "GET", "/metrics", "")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "han_project_data_state_invalid_total ") {
				return l
			}
		}
		return ""
	}
	check := func(t *testing.T, p testProject, reqs []queueReq) {
		t.Helper()
		before, m0 := h.dumpAll(p), metric()
		for _, r := range reqs {
			code, b := h.do(p.write, r.method, p.path(r.path), r.body)
			if code != 503 || string(b) != `{"error":"data_state_invalid"}` {
				t.Fatalf("%s %s: %d %s", r.method, r.path, code, b)
			}
		}
		if h.dumpAll(p) != before {
			t.Fatal("a refused request wrote to Redis")
		}
		if m1 := metric(); m1 == m0 || m1 == "" {
			t.Fatalf("not counted: %q → %q", m0, m1)
		}
	}
	t.Run("stream of the wrong type", func(t *testing.T) {
		defer h.as(t)()
		f := h.queueFixture()
		k := f.p.keys.TopicStream(f.top.ID)
		h.admin.Del(ctx, k)
		h.admin.SAdd(ctx, k, "x")
		check(t, f.p, []queueReq{
			{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"p","clientEventId":"x","payload":{}}`},
			{"POST", "/subscriptions/" + f.sub.ID + "/claim", `{"count":1}`},
			{"POST", "/topics/" + f.top.ID + "/trim", `{}`},
			{"POST", "/subscriptions", fmt.Sprintf(`{"topicId":%q,"name":"n"}`, f.top.ID)},
			{"DELETE", "/topics/" + f.top.ID, ""},
			{"GET", "/topics/" + f.top.ID + "/messages", ""},
			{"GET", "/subscriptions/" + f.sub.ID + "/receipts", ""},
		})
	})
	t.Run("budget counter below zero", func(t *testing.T) {
		defer h.as(t)()
		f := h.queueFixture()
		h.admin.HSet(ctx, f.p.keys.Budget(), "rcpt", -4096)
		check(t, f.p, []queueReq{
			{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"p","clientEventId":"x","payload":{}}`},
			{"POST", "/topics/" + f.top.ID + "/trim", `{}`},
			{"DELETE", "/subscriptions/" + f.sub.ID, ""},
			{"DELETE", "/topics/" + f.top.ID, ""},
			{"GET", "", ""},
		})
	})
	t.Run("a receipt whose message is gone", func(t *testing.T) {
		defer h.as(t)()
		f := h.queueFixture()
		h.admin.XDel(ctx, f.p.keys.TopicStream(f.top.ID), f.held.Message.ID)
		h.waitRedisPast(f.held.LeaseUntil)
		check(t, f.p, []queueReq{
			{"POST", "/subscriptions/" + f.sub.ID + "/claim", `{"count":5}`},
		})
	})
	t.Run("a subscription whose topic is gone", func(t *testing.T) {
		defer h.as(t)()
		f := h.queueFixture()
		h.admin.HDel(ctx, f.p.keys.Topics(), f.top.ID)
		check(t, f.p, []queueReq{
			{"POST", "/subscriptions/" + f.sub.ID + "/claim", `{"count":5}`},
			{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"p","clientEventId":"x","payload":{}}`},
		})
	})
	// A subscription record that is JSON but not a subscription (no id of
	// its own, no topic, name or status) is not rewritten with the new
	// status: a pause or resume refuses it before writing.
	for _, rec := range []string{`{"id":1}`, `{}`, `[]`} {
		t.Run("a subscription record that is not one: "+rec, func(t *testing.T) {
			defer h.as(t)()
			f := h.queueFixture()
			h.admin.HSet(ctx, f.p.keys.Subscriptions(), f.sub.ID, rec)
			check(t, f.p, []queueReq{
				{"PATCH", "/subscriptions/" + f.sub.ID, `{"status":"paused"}`},
				{"PATCH", "/subscriptions/" + f.sub.ID, `{"status":"online"}`},
			})
		})
	}
	if strings.Contains(h.logs.String(), "ERR") || strings.Contains(h.logs.String(), "WRONGTYPE") {
		t.Fatalf("raw Redis text in the logs:\n%s", h.logs.String())
	}
}
