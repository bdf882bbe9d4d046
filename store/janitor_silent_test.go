package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The janitor runs on a context only Close ends. When the connection one
// of its DELETEs went out on goes silent (the request lost on its way,
// nothing reset) while PostgreSQL answers every other connection, the run
// is cut (at its Interval here, at most a minute), its connection dropped,
// and the next run purges on a new one: expired idempotency records do not
// pile up until the kernel gives the silent connection up many minutes
// later.
func TestJanitorRunIsBoundedWhenItsConnectionGoesSilent(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	jpool, err := store.OpenPG(ctx, proxied, store.PGConfig{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jpool.Close)

	// The janitor's first DELETE is lost on its way to PostgreSQL; every
	// other connection, and every later request, goes through.
	held, release := p.HoldRequest([]byte("DELETE FROM idempotency_records"))
	t.Cleanup(release)
	j := store.NewJanitor(store.New(jpool), store.JanitorConfig{Interval: 500 * time.Millisecond}, nil)
	j.Start()
	t.Cleanup(j.Close)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the janitor never sent its DELETE")
	}

	user := ids.New()
	if err := st.EnsureUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records(scope, user_id, key_hmac, fingerprint, status, expires_at)
		SELECT 'janitor-silent', $1, 'old' || g, 'f', 201, now() - interval '1 minute' FROM generate_series(1, 5) g`, user); err != nil {
		t.Fatal(err)
	}
	if err := jpool.Ping(ctx); err != nil { // PostgreSQL answers through the proxy too
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_records WHERE scope='janitor-silent'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, "expired idempotency records still there 20 s later (interval 500 ms, a run cut at its interval): "+
		"the janitor still waits on the DELETE whose request was lost")
}
