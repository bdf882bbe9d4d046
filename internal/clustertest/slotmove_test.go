package clustertest_test

import (
	"context"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
)

// moveSlot moves slot from one master to another the way an operator
// does: IMPORTING on the target, MIGRATING on the source, MIGRATE of
// every key (as the admin user), then the new owner announced to every
// master.
func moveSlot(t *testing.T, ctx context.Context, c *testenv.RedisCluster, slot int, from, to *testenv.RedisServer) int {
	t.Helper()
	src, dst := from.AdminClient(0), to.AdminClient(0)
	defer src.Close()
	defer dst.Close()
	srcID, err := src.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	moved := 0
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", "127.0.0.1", to.Port, "", 0, 5000, "auth2", testenv.AdminUser, c.AdminPwd, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src.Do(ctx, args...).Err())
		moved += len(keys)
	}
	masters, err := c.Masters(ctx)
	must(err)
	// The target first, then the source, then the rest (the documented
	// order, so no node answers MOVED to a node that does not know yet).
	must(dst.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
	for _, m := range masters {
		if m == from || m == to {
			continue
		}
		a := m.AdminClient(0)
		err := a.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
		a.Close()
		must(err)
	}
	return moved
}

// After a slot moves to another master, every script runs again on its
// keys through the same client (it follows MOVED and reloads its slot
// map), the keys came along, and the new owner loads the scripts it lacks.
func TestScriptsRunAfterSlotMove(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	rdb := open(t, c)
	ps := allPlaces()
	runAll(t, ctx, rdb, ps)
	if t.Failed() {
		t.FailNow()
	}
	k := ps[0].project()
	slot := testenv.Slot(k.Topics())
	from, err := c.MasterOf(ctx, k.Topics())
	if err != nil {
		t.Fatal(err)
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := masters[0]
	if to == from {
		to = masters[1]
	}
	before, err := rdb.HLen(ctx, k.Topics()).Result()
	if err != nil || before == 0 {
		t.Fatalf("the project's topics before the move: %d %v", before, err)
	}
	if n := moveSlot(t, ctx, c, slot, from, to); n == 0 {
		t.Fatal("the slot held no keys to move")
	}
	if owner, err := c.MasterOf(ctx, k.Topics()); err != nil || owner != to {
		t.Fatalf("slot %d not on the target after the move (%v)", slot, err)
	}
	if after, err := rdb.HLen(ctx, k.Topics()).Result(); err != nil || after != before {
		t.Fatalf("topics after the move: %d (%v), want %d", after, err, before)
	}
	// The target starts without scripts, as a node added to take slots does.
	a := to.AdminClient(0)
	err = a.ScriptFlush(ctx).Err()
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	runAll(t, ctx, rdb, ps)
	if !scriptOn(t, ctx, to, lua.ProjectTopicPublish) {
		t.Error("the new owner of the slot did not load the script run on it")
	}
}
