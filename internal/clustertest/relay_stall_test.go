package clustertest_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// One master stalls (stopped, before any failover) with an outbox row of
// its own first in the relay's batch, that row's delivery lock on it too:
// the row is left pending, uncharged, and the rows of the healthy masters
// claimed after it are published in the same run. The delivery lock call
// that got no reply is remembered (rds.Locker releases it once the master
// answers), and its release must not be tried first on every later lock
// of the other masters: each try waits out a read timeout on the stalled
// master, and the batch, which goes on for a delivery lock's life past a
// failure, ran out of time after a few rows.
func TestRelayDeliversPastAStalledMaster(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	relay, err := pubsub.NewRelay(st, rdb, pubsub.RelayConfig{Grace: time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		claimed, _, _ := relay.RunOnce(ctx)
		return claimed == 0
	}, "the relay did not drain the rows pending before the test")

	victim := masterWithoutCanary(t, c, "none")
	var healthy []*testenv.RedisServer
	for _, m := range c.Nodes[:c.Opts.Masters] {
		if m != victim {
			healthy = append(healthy, m)
		}
	}
	held := sendWithLockOn(t, c, st, victim, victim)
	var after []store.OutboxEvent
	for i := range 12 {
		m := healthy[i%len(healthy)]
		after = append(after, sendWithLockOn(t, c, st, m, m))
	}

	thaw := victim.Freeze(t)
	defer thaw()
	if _, _, err := relay.RunOnce(ctx); err == nil {
		t.Error("a run with a stalled master reported no failure")
	}
	if attempts, delivered := rowState(t, pool, held.EventID); attempts != 0 || delivered {
		t.Fatalf("the stalled master's row: %d attempts, delivered %v; want pending and uncharged", attempts, delivered)
	}
	missing := 0
	for _, ev := range after {
		if _, delivered := rowState(t, pool, ev.EventID); !delivered {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of the %d rows of healthy masters claimed after the stalled master's row were not published in that run", missing, len(after))
	}
	thaw()
	testenv.Eventually(t, 20*time.Second, func() bool {
		_, _, _ = relay.RunOnce(ctx)
		_, delivered := rowState(t, pool, held.EventID)
		return delivered
	}, "the stalled master's row was not delivered once it woke")
}

// sendWithLockOn commits a message with its outbox event, never published,
// in a new dialog whose channel lives on master m, under a message id
// whose delivery lock lives on master lock.
func sendWithLockOn(t *testing.T, c *testenv.RedisCluster, st *store.Store, m, lock *testenv.RedisServer) store.OutboxEvent {
	t.Helper()
	ctx := context.Background()
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	dialog := strings.TrimPrefix(channelOn(t, c, m, pubsub.DialogChannel("")), pubsub.DialogChannel(""))
	if _, err := st.CreateDialog(ctx, dialog, a, "", []string{b}); err != nil {
		t.Fatal(err)
	}
	id := ""
	for range 1000 {
		id = ids.New()
		owner, err := c.MasterOf(ctx, rds.LockKey(rds.LockDelivery, id))
		if err != nil {
			t.Fatal(err)
		}
		if owner == lock {
			break
		}
	}
	_, ev, created, err := st.SendMessage(ctx, store.SendMessage{ID: id, DialogID: dialog, SenderID: a,
		Body: "past a stalled master?", Event: true})
	if err != nil || !created {
		t.Fatalf("send: created %v: %v", created, err)
	}
	return ev
}
