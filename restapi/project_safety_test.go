package restapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

type runtimeSnap struct {
	Runtime struct {
		EvictionPolicy string `json:"evictionPolicy"`
		WritesAllowed  bool   `json:"writesAllowed"`
	} `json:"runtime"`
}

func TestProjectEvictionPolicyGate(t *testing.T) {
	for _, c := range []struct {
		policy string
		safe   bool
	}{
		{"allkeys-lru", false}, {"allkeys-lfu", false}, {"allkeys-random", false},
		{"volatile-lru", true}, {"volatile-ttl", true},
	} {
		t.Run(c.policy, func(t *testing.T) {
			rs, err := testenv.StartRedis(testenv.RedisOptions{EvictionPolicy: c.policy})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Stop()
			h := newPrjHarnessOn(t, rs, rs.URL(0))
			p := h.project()
			// Data written before the policy changed still reads.
			if _, err := project.NewCache(h.rdb).Put(context.Background(), p.keys,
				project.Mirror{CacheQuotaBytes: 1 << 20}, project.CachePut{Key: "old", Type: "string", Value: "v", TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			before := h.projectKeys(p)
			code, b := h.put(p.write, p, `{"key":"k","type":"string","value":"v"}`)
			if c.safe {
				if code != 201 {
					t.Fatalf("PUT under %s: %d %s", c.policy, code, b)
				}
			} else {
				wantError(t, code, b, 503, "unsafe_eviction_policy")
				code, b = h.do(p.write, "DELETE", p.path("/cache?key=old"), "")
				wantError(t, code, b, 503, "unsafe_eviction_policy")
				code, b = h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":true}`)
				wantError(t, code, b, 503, "unsafe_eviction_policy")
				if after := h.projectKeys(p); strings.Join(after, ",") != strings.Join(before, ",") {
					t.Fatalf("refused writes changed keys: %v → %v", before, after)
				}
			}
			if got := h.list(p.read, p, ""); len(got.Items) == 0 || got.Items[0].Key != "old" {
				t.Fatalf("GET /cache under %s: %+v", c.policy, got.Items)
			}
			code, b = h.do(p.read, "GET", p.path(""), "")
			s := decode[runtimeSnap](t, b)
			if code != 200 || s.Runtime.EvictionPolicy != c.policy || s.Runtime.WritesAllowed != c.safe {
				t.Fatalf("snapshot under %s: %d %s", c.policy, code, b)
			}
		})
	}
	t.Run("policy change at run time", func(t *testing.T) {
		rs, err := testenv.StartRedis(testenv.RedisOptions{EvictionPolicy: "volatile-lru"})
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Stop()
		h := newPrjHarnessOn(t, rs, rs.URL(0))
		p := h.project()
		h.putKV(p, "k", "v", 60)
		if err := h.admin.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() bool {
			code, _ := h.put(p.write, p, `{"key":"k","type":"string","value":"v"}`)
			return code == 503
		}, "the gate did not notice the new policy")
	})
}

// The service connected as a user whose ACL denies PEXPIREAT: the write is
// refused before anything is written, so no entry is left without a TTL.
func TestProjectExpiryDeniedByACL(t *testing.T) {
	const pw = "noexp-password-0123456789"
	line := strings.Replace(rds.APIBackendRule(pw, false), "user "+rds.APIBackendUser+" ", "user api_noexp ", 1) + " -pexpireat"
	rs, err := testenv.StartRedis(testenv.RedisOptions{ExtraACL: []string{line}})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	good := newPrjHarnessOn(t, rs, rs.URL(0))
	bad := newPrjHarnessOn(t, rs, fmt.Sprintf("redis://api_noexp:%s@%s/0", pw, rs.Addr()))
	p := good.project()
	ctx := context.Background()
	good.putKV(p, "k", "old", 600)
	exp := good.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val()
	meta := good.admin.HGetAll(ctx, p.keys.Meta()).Val()

	code, b := bad.put(p.write, p, `{"key":"k","type":"string","value":"new"}`)
	wantError(t, code, b, 503, "redis_expiry_denied")
	code, b = bad.put(p.write, p, `{"key":"fresh","type":"string","value":"new"}`)
	wantError(t, code, b, 503, "redis_expiry_denied")

	if v := good.admin.HGet(ctx, p.keys.CacheEntry("k"), "v").Val(); v != "old" {
		t.Fatalf("old value replaced: %q", v)
	}
	if got := good.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val(); got != exp {
		t.Fatalf("deadline moved %v → %v", exp, got)
	}
	if n := good.admin.Exists(ctx, p.keys.CacheEntry("fresh")).Val(); n != 0 {
		t.Fatal("a refused PUT created its entry")
	}
	if bad := good.entryKeysWithoutTTL(p); len(bad) != 0 {
		t.Fatalf("entries without TTL: %v", bad)
	}
	if after := good.admin.HGetAll(ctx, p.keys.Meta()).Val(); fmt.Sprint(after) != fmt.Sprint(meta) {
		t.Fatalf("metadata changed: %v → %v", meta, after)
	}
	// Reads still work for that user.
	if got := bad.list(p.read, p, ""); len(got.Items) != 1 || got.Items[0].Value != "old" {
		t.Fatalf("listing: %+v", got.Items)
	}
	if strings.Contains(bad.logs.String(), "NOPERM") || strings.Contains(bad.logs.String(), "old") {
		t.Fatalf("raw Redis text or a value in the logs:\n%s", bad.logs.String())
	}
}

// Tiny maxmemory with noeviction: writes are refused up front (503
// redis_oom) leaving the previous value intact, reads keep working.
func TestProjectRedisOOM(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "64mb", EvictionPolicy: "noeviction"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newPrjHarnessOn(t, rs, rs.URL(0))
	p := h.project()
	ctx := context.Background()
	h.putKV(p, "k", "old", 600)
	h.putKV(p, "gone", "x", 600)
	exp := h.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val()
	// Shrink maxmemory below what the server uses: every write is now
	// refused (filling it up instead leaves the outcome to allocator noise).
	if err := h.admin.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.admin.Set(ctx, "filler", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("the server is not out of memory: %v", err)
	}
	code, b := h.put(p.write, p, `{"key":"k","type":"string","value":"new"}`)
	wantError(t, code, b, 503, "redis_oom")
	code, b = h.put(p.write, p, `{"key":"fresh","type":"string","value":"new"}`)
	wantError(t, code, b, 503, "redis_oom")
	if v := h.admin.HGet(ctx, p.keys.CacheEntry("k"), "v").Val(); v != "old" || h.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val() != exp {
		t.Fatalf("old value or deadline changed: %q", v)
	}
	if h.admin.Exists(ctx, p.keys.CacheEntry("fresh")).Val() != 0 {
		t.Fatal("a refused PUT created its entry")
	}
	// Reads (pipelined reads and no-writes scripts) still answer.
	if got := h.list(p.read, p, ""); len(got.Items) != 2 || got.Items[0].Value != "old" {
		t.Fatalf("listing under OOM: %+v", got.Items)
	}
	if code, b := h.do(p.read, "GET", p.path(""), ""); code != 200 {
		t.Fatalf("snapshot under OOM: %d %s", code, b)
	}
	// Deleting frees memory, so it is allowed under OOM.
	if code, b := h.do(p.write, "DELETE", p.path("/cache?key=gone"), ""); code != 204 {
		t.Fatalf("delete under OOM: %d %s", code, b)
	}
	if bad := h.entryKeysWithoutTTL(p); len(bad) != 0 {
		t.Fatalf("entries without TTL: %v", bad)
	}
}

func TestProjectDataStateInvalid(t *testing.T) {
	h := newPrjHarness(t)
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
	cases := []struct {
		name   string
		break_ func(p testProject)
	}{
		{"metadata missing while data keys exist", func(p testProject) { h.admin.Del(ctx, p.keys.Meta()) }},
		{"metadata of the wrong type", func(p testProject) {
			h.admin.Del(ctx, p.keys.Meta())
			h.admin.Set(ctx, p.keys.Meta(), "x", 0)
		}},
		{"index of the wrong type", func(p testProject) {
			h.admin.Del(ctx, p.keys.CacheIndex())
			h.admin.SAdd(ctx, p.keys.CacheIndex(), "k")
		}},
		{"legacy container of the wrong type", func(p testProject) { h.admin.Set(ctx, p.keys.CacheContainer(), "x", 0) }},
		{"sequence behind its index", func(p testProject) { h.admin.HSet(ctx, p.keys.Meta(), "seq", 0) }},
		{"usage counter below zero", func(p testProject) { h.admin.HSet(ctx, p.keys.Meta(), "cacheBytes", -5) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			p := h.project()
			h.putKV(p, "k", "old", 600)
			c.break_(p)
			dump := func() string {
				var sb strings.Builder
				for _, k := range h.projectKeys(p) {
					v, _ := h.admin.Dump(ctx, k).Result()
					fmt.Fprintf(&sb, "%s=%x;", k, v)
				}
				return sb.String()
			}
			before, m0 := dump(), metric()
			for _, r := range []struct{ method, path, body string }{
				{"PUT", "/cache", `{"key":"k","type":"string","value":"new"}`},
				{"PUT", "/cache", `{"key":"n","type":"string","value":"new"}`},
				{"DELETE", "/cache?key=k", ""},
				{"GET", "/cache", ""},
				{"GET", "", ""},
				{"PUT", "/settings", `{"deliveryPaused":true}`},
			} {
				code, b := h.do(p.admin, r.method, p.path(r.path), r.body)
				wantError(t, code, b, 503, "data_state_invalid")
			}
			if after := dump(); after != before {
				t.Fatal("a refused request wrote to Redis")
			}
			var paused bool
			if err := h.pool.QueryRow(ctx, "SELECT delivery_paused FROM projects WHERE id=$1", p.id).Scan(&paused); err != nil || paused {
				t.Fatalf("settings changed in PostgreSQL (%v)", err)
			}
			if m1 := metric(); m1 == m0 || m1 == "" {
				t.Fatalf("data_state_invalid not counted: %q → %q", m0, m1)
			}
		})
	}
	if !strings.Contains(h.logs.String(), `"msg":"project data state invalid"`) {
		t.Fatal("data_state_invalid is not logged")
	}
}
