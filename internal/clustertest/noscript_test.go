package clustertest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
)

// cached reports whether node has every script in its script cache.
func cached(t *testing.T, ctx context.Context, node *testenv.RedisServer) bool {
	t.Helper()
	a := node.AdminClient(0)
	defer a.Close()
	hashes := make([]string, 0, len(lua.All()))
	for _, s := range lua.All() {
		hashes = append(hashes, s.Hash())
	}
	ok, err := a.ScriptExists(ctx, hashes...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ok {
		if !v {
			return false
		}
	}
	return true
}

// lua.LoadAll on a cluster client loads every script on every master, and
// a master that lost its script cache (SCRIPT FLUSH, a restart) is
// reloaded by the calls that reach it: EVALSHA's NOSCRIPT falls back to
// EVAL on that node alone, and the other masters keep theirs.
func TestNoScriptReloadsPerNode(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	if err := lua.LoadAll(ctx, rdb); err != nil {
		t.Fatalf("LoadAll as api_backend: %v", err)
	}
	masters, err := env.Cluster.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters: %d %v", len(masters), err)
	}
	for _, m := range masters {
		if !cached(t, ctx, m) {
			t.Fatalf("LoadAll left master %s without every script", m.Addr())
		}
	}
	flushed := masters[1]
	a := flushed.AdminClient(0)
	err = a.ScriptFlush(ctx).Err()
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	if cached(t, ctx, flushed) {
		t.Fatal("SCRIPT FLUSH left scripts cached")
	}
	runAll(t, ctx, rdb, allPlaces())
	// rt_instances_add has one fixed key (the registry of instances), so
	// only the master of that key sees it.
	registry, err := env.Cluster.MasterOf(ctx, presence.InstancesKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		for _, s := range lua.All() {
			if s == lua.RTInstancesAdd && m != registry {
				continue
			}
			if !scriptOn(t, ctx, m, s) {
				t.Errorf("master %s lacks %s after the calls that reached it", m.Addr(), s.Name)
			}
		}
	}
}

// After a master dies and its replica takes over, every script runs again
// on the keys of the failed-over slots, without a restart of the client:
// the client follows the new slot map, and the promoted replica, whose
// script cache is empty, loads each script on its first NOSCRIPT. Data
// written before the failure and replicated is still there.
func TestScriptsRunAfterFailover(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	rdb := open(t, c)
	if err := lua.LoadAll(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	ps := allPlaces()
	key := ps[0].idem().RecordKey()
	victim, err := c.MasterOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := invocations["idem_reserve"](ctx, rdb, ps[0]); err != nil {
		t.Fatal(err)
	}
	// The reservation reaches the replica before the master dies.
	va := victim.AdminClient(0)
	n, err := va.Do(ctx, "wait", 1, 2000).Int()
	va.Close()
	if err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d %v", n, err)
	}

	victim.Kill()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatalf("the replica was not promoted: %v", err)
	}
	promoted, err := c.MasterOf(ctx, key)
	if err != nil || promoted == victim {
		t.Fatalf("slot still on the dead master (%v)", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	exists := func() error {
		n, err := rdb.Exists(ctx, key).Result()
		if err == nil && n != 1 {
			err = fmt.Errorf("the reservation is gone")
		}
		return err
	}
	for err := exists(); err != nil; err = exists() {
		if time.Now().After(deadline) {
			t.Fatalf("the client did not reach the promoted master, or the replicated reservation was lost: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	runAll(t, ctx, rdb, ps)
	if !scriptOn(t, ctx, promoted, lua.IdemReserve) {
		t.Error("the promoted master did not load the script it ran")
	}
}

func scriptOn(t *testing.T, ctx context.Context, node *testenv.RedisServer, s *lua.Script) bool {
	t.Helper()
	a := node.AdminClient(0)
	defer a.Close()
	ok, err := a.ScriptExists(ctx, s.Hash()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return ok[0]
}
