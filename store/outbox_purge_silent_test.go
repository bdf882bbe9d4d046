package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The purge loop runs on a context only Close ends. When the connection a
// DELETE went out on goes silent (the request lost on its way, nothing
// reset) while PostgreSQL answers every other connection, the DELETE is
// cut after one budget, its connection dropped, and the next run purges
// on a new one: delivered rows past the retention do not pile up until the
// kernel gives the silent connection up many minutes later.
func TestOutboxPurgeIsBoundedWhenItsConnectionGoesSilent(t *testing.T) {
	_, pool := openStore(t)
	ctx := context.Background()
	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	ppool, err := store.OpenPG(ctx, proxied, store.PGConfig{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ppool.Close)

	// The purger's first DELETE is lost on its way to PostgreSQL; every
	// other connection, and every later request, goes through.
	held, release := p.HoldRequest([]byte("DELETE FROM outbox"))
	t.Cleanup(release)
	purger, err := store.NewOutboxPurger(store.New(ppool), store.OutboxPurgerConfig{Retention: time.Hour,
		Interval: 200 * time.Millisecond, Budget: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	purger.Start()
	t.Cleanup(purger.Close)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the purger never sent its DELETE")
	}

	ch, _ := insertOutbox(t, pool, 10)
	if _, err := pool.Exec(ctx, "UPDATE outbox SET created_at = now() - interval '2 hours', delivered_at = now() - interval '2 hours' WHERE channel=$1", ch); err != nil {
		t.Fatal(err)
	}
	if err := ppool.Ping(ctx); err != nil { // PostgreSQL answers through the proxy too
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE channel=$1", ch).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, "delivered rows past the retention still there 20 s later (interval 200 ms, budget 1 s): "+
		"the purger still waits on the DELETE whose request was lost")
}
