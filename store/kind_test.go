package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// A PostgreSQL failure is logged and counted by its SQLSTATE, never by the
// message, which quotes the offending row; other errors get the Redis
// plumbing's names, so the same failure has one name in every package.
func TestKindNamesPostgresFailuresBySQLState(t *testing.T) {
	_, pool := openStore(t)
	ctx := context.Background()
	id := ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO users (id) VALUES ($1)`, id); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO users (id) VALUES ($1)`, id)
	if got := store.Kind(fmt.Errorf("ensure user: %w", err)); got != "pg:23505" {
		t.Errorf("duplicate key: kind %q, want pg:23505", got)
	}
	if got := store.Kind(fmt.Errorf("send: %w", store.ErrDatabaseBusy)); got != "pg_busy" {
		t.Errorf("database busy: kind %q", got)
	}
	if got := store.Kind(rds.ErrRedisUnavailable); got != rds.Kind(rds.ErrRedisUnavailable) {
		t.Errorf("redis failure: store kind %q differs from rds kind %q", got, rds.Kind(rds.ErrRedisUnavailable))
	}
}
