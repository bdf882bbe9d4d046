package main

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The service starts the idempotency janitor with itself and stops it on
// Close (TestMain's goleak check fails the package if it kept running).
func TestServiceRunsTheIdempotencyJanitor(t *testing.T) {
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	user := ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records(scope, user_id, key_hmac, fingerprint, status, expires_at)
		VALUES ('msg_send', $1, 'expired', 'f', 201, now() - interval '1 second'),
		       ('msg_send', $1, 'live', 'f', 201, now() + interval '1 hour')`, user); err != nil {
		t.Fatal(err)
	}
	m := start(t, baseEnv())
	count := func(key string) int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records WHERE user_id=$1 AND key_hmac=$2", user, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return count("expired") == 0 }, "the janitor did not purge the expired record")
	if count("live") != 1 {
		t.Fatal("the janitor purged a live record")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
