package clustertest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/store/rds"
)

// places is how many identity sets the script test runs on; the test
// checks that they spread every key family over all three masters.
const places = 12

// runAll runs every script at every place and reports each failure.
func runAll(t *testing.T, ctx context.Context, c redis.Scripter, ps []place) {
	t.Helper()
	for _, s := range lua.All() {
		run, ok := invocations[s.Name]
		if !ok {
			t.Errorf("script %s has no cluster invocation in this test", s.Name)
			continue
		}
		for _, p := range ps {
			if err := run(ctx, c, p); err != nil {
				t.Errorf("script %s at place %d: %v", s.Name, p.n, err)
			}
		}
	}
}

func allPlaces() []place {
	ps := make([]place, places)
	for i := range ps {
		ps[i] = place{n: i}
	}
	return ps
}

// Every script runs on the cluster as api_backend, on keys of every master:
// all the keys one call passes share a hash slot, so Redis (which refuses a
// script whose keys span slots, or that touches a key of a slot the node does
// not serve) runs it. No script declares allow-cross-slot-keys.
func TestEveryScriptIsSingleSlot(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	for _, s := range lua.All() {
		if strings.Contains(s.Source, "allow-cross-slot-keys") {
			t.Errorf("script %s declares allow-cross-slot-keys", s.Name)
		}
	}
	runAll(t, ctx, rdb, allPlaces())
}

// The places put every hash-tagged key family on every master, so the
// script test above ran each script on all three.
func TestPlacesCoverEveryMaster(t *testing.T) {
	ctx := context.Background()
	seen := map[string]map[string]bool{}
	for _, p := range allPlaces() {
		for family, key := range p.tagged() {
			m, err := env.Cluster.MasterOf(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if seen[family] == nil {
				seen[family] = map[string]bool{}
			}
			seen[family][m.Addr()] = true
		}
	}
	for family, ms := range seen {
		if len(ms) != 3 {
			t.Errorf("key family %s reached %d masters, want 3", family, len(ms))
		}
	}
}

// The key builders put every key one script call takes on one hash tag:
// the keys differ only outside the braces.
func TestKeyBuildersShareOneTagPerCall(t *testing.T) {
	p := place{n: 1}
	k, m := p.project(), p.module()
	groups := map[string][]string{
		"project": {k.Meta(), k.CacheContainer(), k.CacheIndex(), k.CacheExpiry(), k.CacheSizes(), k.CacheEntry("a/b"),
			k.Topics(), k.TopicNames(), k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry(),
			k.TopicStream(p.topic()), k.TopicSubscriptions(p.topic()), k.TopicOpen(p.topic()), k.TopicDone(p.topic()),
			k.Receipts(p.sub()), k.Leases(p.sub())},
		"module":   {m.Budget(), m.Reservations(), m.Leases(), m.Projects(), m.Seen()},
		"idem":     idemKeys(p),
		"presence": {presence.ConnKey(p.user(), "c1"), presence.ConnKey(p.user(), "c2"), presence.UserConnsKey(p.user()), presence.OnlineKey(p.user())},
		"instance": {presence.InstanceKey(p.instance()), presence.InstanceConnsKey(p.instance())},
		"lock":     {rds.LockKey("outbox", p.id(5)), rds.FenceKey("outbox", p.id(5))},
	}
	for family, keys := range groups {
		tag := ""
		for _, key := range keys {
			i, j := strings.IndexByte(key, '{'), strings.IndexByte(key, '}')
			if i < 0 || j <= i+1 {
				t.Errorf("%s key %q has no hash tag", family, key)
				continue
			}
			if tag == "" {
				tag = key[i : j+1]
			}
			if key[i:j+1] != tag || testenv.Slot(key) != testenv.Slot(keys[0]) {
				t.Errorf("%s key %q is not on tag %s", family, key, tag)
			}
		}
	}
}
