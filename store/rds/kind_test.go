package rds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/han-app/gateway/store/rds"
)

// Logs and metric labels name a failure by its class only: one failure gets
// one name whichever package reports it, and the name never carries the
// key or argument the raw Redis reply quotes.
func TestKindNamesRedisFailuresWithoutTheirText(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(0))
	const secret = "outside-secret-key"
	noperm := rds.ClassifyRedisError(c.Set(ctx, secret, "v", time.Minute).Err())
	if got := rds.Kind(noperm); got != "redis_noperm" {
		t.Errorf("NOPERM reply: kind %q, want redis_noperm", got)
	}
	if got := rds.Kind(fmt.Errorf("wrapped: %w", rds.ErrExpiryDenied)); got != "redis_expiry_denied" {
		t.Errorf("expiry denied: kind %q", got)
	}
	if got := rds.Kind(rds.ClassifyRedisError(fmt.Errorf("OOM command not allowed when used memory > 'maxmemory'"))); got != "redis_oom" {
		t.Errorf("OOM: kind %q", got)
	}

	closed := apiClient(t, env.Redis.URL(0))
	closed.Close()
	if got := rds.Kind(closed.Ping(ctx).Err()); got != "closed" {
		t.Errorf("closed client: kind %q", got)
	}
	if got := rds.Kind(rds.ClassifyRedisError(closed.Ping(ctx).Err())); got != "redis_unavailable" {
		t.Errorf("closed client, classified: kind %q", got)
	}

	down := apiClient(t, "redis://127.0.0.1:1/0")
	if got := rds.Kind(down.Ping(ctx).Err()); got != "connection refused" {
		t.Errorf("refused dial: kind %q", got)
	}

	named := rds.Named("canary_lost", "pubsub: canary lost")
	if got := rds.Kind(fmt.Errorf("session: %w", named)); got != "canary_lost" {
		t.Errorf("named error: kind %q", got)
	}
	// A PostgreSQL error reaching a package below the store (the outbox
	// relay's run) is named by its SQLSTATE, never its text.
	pgErr := fmt.Errorf("relay outbox: %w", &pgconn.PgError{Code: "55P03", Message: "lock on " + secret})
	if got := rds.Kind(pgErr); got != "pg:55P03" {
		t.Errorf("PostgreSQL error: kind %q, want pg:55P03", got)
	}
	if got := rds.Kind(nil); got != "none" {
		t.Errorf("nil: kind %q", got)
	}
	for _, err := range []error{noperm, fmt.Errorf("parse %s: %w", secret, context.Canceled), pgErr} {
		if k := rds.Kind(err); strings.Contains(k, secret) {
			t.Errorf("kind %q quotes the key", k)
		}
	}
}
