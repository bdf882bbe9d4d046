package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// The outbox relay publishes on a cluster the way the subscribers listen
// (SPUBLISH): the events the request path never published reach the
// sharded subscribers of two instances, once each.
func TestRelayDeliversToShardedSubscribers(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), a, "", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := pubsub.NewRelay(st, rdb, pubsub.RelayConfig{Grace: time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// The outbox is the database's, shared with the package's other
	// tests: rows another test left pending go out first, so that the
	// runs below publish this test's rows alone.
	testenv.Eventually(t, 20*time.Second, func() bool {
		claimed, _, _ := relay.RunOnce(ctx)
		return claimed == 0
	}, "the relay did not drain the rows pending before the test")
	ch := pubsub.DialogChannel(d.ID)
	x, y := subscriber(t, env.Cluster, "inst-x"), subscriber(t, env.Cluster, "inst-y")
	x.subscribe(t, ch)
	y.subscribe(t, ch)
	const n = 5
	for i := range n {
		// Committed with its outbox event, never published: the relay's job.
		if _, _, created, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: a,
			Body: fmt.Sprintf("m%d", i), Event: true}); err != nil || !created {
			t.Fatalf("send %d: created %v: %v", i, created, err)
		}
	}
	total := 0
	testenv.Eventually(t, 5*time.Second, func() bool {
		_, published, err := relay.RunOnce(ctx)
		if err != nil {
			t.Fatalf("relay run: %v", err)
		}
		total += published
		return total >= n
	}, "the relay did not publish all %d events", n)
	if total != n {
		t.Fatalf("the relay published %d events, want %d", total, n)
	}
	for _, r := range []*received{x, y} {
		testenv.Eventually(t, 5*time.Second, func() bool { return r.count(ch) == n },
			"%s got %d of the relay's %d events", r.name, r.count(ch), n)
	}
}
