package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// The relay runs on a context only its Close ends. When the PostgreSQL
// connection its claim (BEGIN + SELECT … FOR UPDATE SKIP LOCKED) went out
// on goes silent — the request lost on its way (a failover whose old
// primary vanished, a dropped conntrack entry), nothing reset — the claim
// is cut within twice the request budget, the connection is dropped, and
// the next run claims on a new one: a committed message whose publish
// after commit failed is published while PostgreSQL answers, not once the
// kernel gives the silent connection up many minutes later.
func TestRelayClaimIsBoundedWhenItsConnectionGoesSilent(t *testing.T) {
	st, pool := openStore(t) // direct: the send path, and the checks
	ctx := context.Background()

	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	rpool, err := store.OpenPG(ctx, proxied, store.PGConfig{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpool.Close)

	// The relay's first claim is lost on its way to PostgreSQL; every
	// other connection, and every later request, goes through.
	held, release := p.HoldRequest([]byte("FOR UPDATE OF o SKIP LOCKED"))
	t.Cleanup(release)

	relay, err := pubsub.NewRelay(store.New(rpool), rtClient(t), pubsub.RelayConfig{
		Grace: time.Second, Interval: 100 * time.Millisecond, PublishTimeout: 500 * time.Millisecond}, discard)
	if err != nil {
		t.Fatal(err)
	}
	relay.Start()
	t.Cleanup(relay.Close)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never sent its claim")
	}

	// A message committed whose publish after commit failed: the outbox
	// relay is what delivers it.
	d := postWithDeadRedis(t, st, pool, 1)
	ch := pubsub.DialogChannel(d)
	if err := rpool.Ping(ctx); err != nil { // PostgreSQL answers through the proxy too
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return pendingFor(t, pool, ch) == 0 },
		"the row was still undelivered 20 s after its commit (grace 1 s, interval 100 ms, request budget 2 s) "+
			"while PostgreSQL answered: the relay still waits on the claim whose request was lost")
}
