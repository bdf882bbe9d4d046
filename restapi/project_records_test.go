package restapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/han-app/gateway/store/project"
)

// dataStateInvalidCount is the han_project_data_state_invalid_total line of
// the server's metrics.
func (h *prjHarness) dataStateInvalidCount() string {
	h.t.Helper()
	_, b := h.do("", "GET", "/metrics", "")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "han_project_data_state_invalid_total ") {
			return l
		}
	}
	return ""
}

// refusedUnchanged runs reqs against p and requires each to answer 503
// data_state_invalid, write nothing and be counted.
func (h *prjHarness) refusedUnchanged(t *testing.T, p testProject, reqs []queueReq) {
	t.Helper()
	before, m0 := h.dumpAll(p), h.dataStateInvalidCount()
	for _, r := range reqs {
		code, b := h.do(p.admin, r.method, p.path(r.path), r.body)
		if code != 503 || string(b) != `{"error":"data_state_invalid"}` {
			t.Fatalf("%s %s %s: %d %s, want 503 data_state_invalid", r.method, r.path, r.body, code, b)
		}
	}
	if h.dumpAll(p) != before {
		t.Fatal("a refused request wrote to Redis")
	}
	if m1 := h.dataStateInvalidCount(); m1 == m0 || m1 == "" {
		t.Fatalf("not counted: %q → %q", m0, m1)
	}
}

// recordCase plants a broken record in a fixture and names the requests
// that must refuse it.
type recordCase struct {
	name  string
	plant func(f queueFixture)
	reqs  func(f queueFixture) []queueReq
}

// A stored record that is not one — a topic, subscription or receipt
// record that is JSON but lacks what every such record has, an entry HASH
// with an unknown type, an unreadable deadline or sequence, or only some of
// its fields — is data no script wrote. A listing that meets one answers
// 503 data_state_invalid as a whole, as it does for a record that is not
// JSON, rather than show it with an empty id or a status no receipt has,
// hide it, or forget it.
func TestListingsRefuseRecordsThatAreNotOnes(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{}, nil)
	ctx := context.Background()
	var cases []recordCase
	snapshot := func(f queueFixture) []queueReq { return []queueReq{{"GET", "", ""}} }
	receipts := func(f queueFixture) []queueReq {
		return []queueReq{{"GET", "/subscriptions/" + f.sub.ID + "/receipts", ""}}
	}
	cache := func(f queueFixture) []queueReq { return []queueReq{{"GET", "/cache", ""}} }
	for _, rec := range []string{`{}`, `null`, `{"name":"t"}`} {
		cases = append(cases,
			recordCase{"topic " + rec, func(f queueFixture) { h.admin.HSet(ctx, f.p.keys.Topics(), f.top.ID, rec) }, snapshot},
			recordCase{"subscription " + rec, func(f queueFixture) { h.admin.HSet(ctx, f.p.keys.Subscriptions(), f.sub.ID, rec) }, snapshot},
		)
	}
	for _, rec := range []string{`{}`, `{"id":1}`, `null`, `{"s":"lost","a":1,"l":0,"u":1}`} {
		cases = append(cases, struct {
			name  string
			plant func(f queueFixture)
			reqs  func(f queueFixture) []queueReq
		}{"receipt " + rec, func(f queueFixture) { h.admin.HSet(ctx, f.p.keys.Receipts(f.sub.ID), f.held.Message.ID, rec) }, receipts})
	}
	entry := func(name string, plant func(e string)) recordCase {
		return recordCase{"cache entry " + name, func(f queueFixture) { plant(f.p.keys.CacheEntry("k")) }, cache}
	}
	cases = append(cases,
		recordCase{"legacy field with an empty value", func(f queueFixture) {
			h.admin.HSet(ctx, f.p.keys.CacheContainer(), "old", "")
		}, cache},
		entry("type abc", func(e string) { h.admin.HSet(ctx, e, "t", "abc") }),
		entry("deadline 1.5", func(e string) { h.admin.HSet(ctx, e, "e", "1.5") }),
		entry("deadline -1", func(e string) { h.admin.HSet(ctx, e, "e", "-1") }),
		entry("deadline 20 digits", func(e string) { h.admin.HSet(ctx, e, "e", "99999999999999999999") }),
		entry("sequence 1e3", func(e string) { h.admin.HSet(ctx, e, "s", "1e3") }),
		entry("sequence empty", func(e string) { h.admin.HSet(ctx, e, "s", "") }),
		entry("without its value", func(e string) { h.admin.HDel(ctx, e, "v") }),
		entry("without its deadline", func(e string) { h.admin.HDel(ctx, e, "e") }),
		entry("without its type", func(e string) { h.admin.HDel(ctx, e, "t") }),
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			f := h.queueFixture()
			h.putKV(f.p, "k", "v", 600)
			c.plant(f)
			h.refusedUnchanged(t, f.p, c.reqs(f))
		})
	}
	// An entry whose value is the empty string is one.
	t.Run("cache entry with an empty value", func(t *testing.T) {
		defer h.as(t)()
		p := h.project()
		h.putKV(p, "k", "", 600)
		if l := h.list(p.read, p, ""); len(l.Items) != 1 || l.Items[0].Value != "" {
			t.Fatalf("listing: %+v", l)
		}
	})
}

// A count or size the scripts keep — a project budget counter, a topic's
// message bytes, a message's open-receipt count, the cache usage and the
// mirrored quota in the metadata HASH, the module budget's counters — is a
// decimal integer as HINCRBY writes it. One spelled otherwise ("1.5",
// "1e3", "-1", empty, 20 digits) is data no script wrote: every request
// that uses it answers 503 data_state_invalid and writes nothing, never a
// figure read from it, a redis_unavailable after part of its writes, or an
// answer computed from a misread quota.
func TestUnreadableCountsAreDataStateInvalidWithNothingWritten(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{}, nil)
	ctx := context.Background()
	mk := project.NewModuleKeys(prjEnv)
	hset := func(key func(f queueFixture) string, field func(f queueFixture) string, v string) func(f queueFixture) {
		return func(f queueFixture) { h.admin.HSet(ctx, key(f), field(f), v) }
	}
	budget := func(f queueFixture) string { return f.p.keys.Budget() }
	meta := func(f queueFixture) string { return f.p.keys.Meta() }
	named := func(s string) func(queueFixture) string { return func(queueFixture) string { return s } }
	publish := func(f queueFixture) queueReq {
		return queueReq{"POST", "/topics/" + f.top.ID + "/messages", `{"producerId":"p","clientEventId":"x","payload":{}}`}
	}
	var cases []recordCase
	for _, v := range []string{"1.5", "1e3", "99999999999999999999", "", "-0", "-1"} {
		cases = append(cases,
			recordCase{"budget msg " + v, hset(budget, named("msg"), v), func(f queueFixture) []queueReq {
				return []queueReq{{"GET", "", ""}, publish(f), {"POST", "/topics/" + f.top.ID + "/trim", `{}`},
					{"DELETE", "/topics/" + f.top.ID, ""}}
			}},
			recordCase{"topic bytes " + v, hset(budget, func(f queueFixture) string { return "tb:" + f.top.ID }, v),
				func(f queueFixture) []queueReq {
					return []queueReq{publish(f), {"POST", "/topics/" + f.top.ID + "/trim", `{}`}, {"DELETE", "/topics/" + f.top.ID, ""}}
				}},
			recordCase{"open count " + v, func(f queueFixture) { h.admin.HSet(ctx, f.p.keys.TopicOpen(f.top.ID), f.held.Message.ID, v) },
				func(f queueFixture) []queueReq {
					return []queueReq{{"POST", "/subscriptions/" + f.sub.ID + "/receipts", fmt.Sprintf(
						`{"messageId":%q,"token":%q,"status":"processed"}`, f.held.Message.ID, f.held.Token)},
						{"DELETE", "/subscriptions/" + f.sub.ID, ""}}
				}},
			recordCase{"cache usage " + v, hset(meta, named("cacheBytes"), v), func(f queueFixture) []queueReq {
				return []queueReq{{"GET", "", ""}, {"GET", "/cache", ""}, {"PUT", "/cache", `{"key":"n","type":"string","value":"new"}`},
					{"DELETE", "/cache?key=k", ""}}
			}},
			recordCase{"mirrored quota " + v, hset(meta, named("quota"), v), func(f queueFixture) []queueReq {
				return []queueReq{{"PUT", "/cache", `{"key":"n","type":"string","value":"new"}`}}
			}},
			recordCase{"module committed " + v, hset(func(queueFixture) string { return mk.Budget() }, named("committed"), v),
				func(f queueFixture) []queueReq {
					return []queueReq{{"GET", "", ""}, publish(f), {"POST", "/topics/" + f.top.ID + "/trim", `{}`},
						{"DELETE", "/subscriptions/" + f.sub.ID, ""}, {"DELETE", "/topics/" + f.top.ID, ""}}
				}},
			recordCase{"module generation " + v, hset(func(queueFixture) string { return mk.Budget() }, named("gen"), v),
				func(f queueFixture) []queueReq {
					return []queueReq{publish(f), {"POST", "/topics/" + f.top.ID + "/trim", `{}`}, {"DELETE", "/topics/" + f.top.ID, ""}}
				}},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			f := h.queueFixture()
			h.putKV(f.p, "k", "v", 600)
			// The module budget is every project's: put it back as it was.
			saved, err := h.admin.HMGet(ctx, mk.Budget(), "committed", "gen").Result()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for i, field := range []string{"committed", "gen"} {
					if saved[i] == nil {
						h.admin.HDel(ctx, mk.Budget(), field)
					} else {
						h.admin.HSet(ctx, mk.Budget(), field, saved[i])
					}
				}
			}()
			c.plant(f)
			h.refusedUnchanged(t, f.p, c.reqs(f))
		})
	}
}
