package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/store"
)

// OutboxMarker.Close (the last step of the drain before the pools close)
// flushes what is queued within one flush budget in all: with PostgreSQL
// stalled (a lock on the outbox, as a migration holds) and the queue full,
// which is when it fills, one 2 s budget per queued batch held Close for
// 32 s, past the stop budget an instance's supervisor gives it. What is
// left is dropped and counted; the relay publishes those rows again.
func TestOutboxMarkerCloseIsBoundedWhenPostgreSQLStalls(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	_, evs := insertOutbox(t, pool, 4096)

	// A stalled PostgreSQL: the outbox is locked by another session (a
	// migration's DDL, a hand-run maintenance statement).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)

	m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{}, nil) // production defaults
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range evs {
		m.Mark(id)
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
		t.Logf("Close returned after %v", time.Since(start).Round(100*time.Millisecond))
	case <-time.After(6 * time.Second):
		<-done
		t.Fatalf("OutboxMarker.Close with PostgreSQL stalled took %v, want about one 2 s flush budget",
			time.Since(start).Round(100*time.Millisecond))
	}
}
