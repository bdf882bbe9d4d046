package clustertest_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	const grace = time.Millisecond
	relay, err := pubsub.NewRelay(st, rdb, pubsub.RelayConfig{Grace: grace}, slog.New(slog.DiscardHandler))
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

	awaitPastGrace(t, pool, grace, append(after, held)...)

	thaw := victim.Freeze(t)
	defer thaw()
	claimed, _, err := relay.RunOnce(ctx)
	if err == nil {
		t.Error("a run with a stalled master reported no failure")
	}
	if claimed != 1+len(after) {
		t.Fatalf("the run claimed %d rows, want the test's %d", claimed, 1+len(after))
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

// awaitPastGrace waits until the outbox rows of evs are older than grace
// by the database's clock, which the relay's claim judges them by: a row
// younger than its grace belongs to the request path and is not claimed,
// and a run started right after the last send can begin within a
// millisecond of that row's commit.
func awaitPastGrace(t *testing.T, pool *pgxpool.Pool, grace time.Duration, evs ...store.OutboxEvent) {
	t.Helper()
	events := make([]string, len(evs))
	for i, ev := range evs {
		events[i] = ev.EventID
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		var young int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox
			WHERE event_id = ANY($1::uuid[]) AND created_at >= now() - make_interval(secs => $2)`,
			events, grace.Seconds()).Scan(&young); err != nil {
			t.Fatal(err)
		}
		return young == 0
	}, "the test's outbox rows did not grow older than the relay's grace")
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
