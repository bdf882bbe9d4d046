package store_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/store"
)

// The purge deletes exactly the delivered rows older than the retention, in
// batches; rows delivered within the retention and undelivered rows of any
// age stay, and the old undelivered ones are counted and logged.
func TestOutboxPurgeDeletesOnlyOldDeliveredRows(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	// Other tests' rows are left out of this one's counts by channel.
	oldCh, _ := insertOutbox(t, pool, 23)
	youngCh, _ := insertOutbox(t, pool, 5)
	pendingCh, _ := insertOutbox(t, pool, 3)
	for _, q := range []struct {
		sql string
		ch  string
	}{
		{"UPDATE outbox SET created_at = now() - interval '2 hours', delivered_at = now() - interval '2 hours' WHERE channel=$1", oldCh},
		// Created long ago, delivered (by the relay) a minute ago: kept.
		{"UPDATE outbox SET created_at = now() - interval '2 hours', delivered_at = now() - interval '1 minute' WHERE channel=$1", youngCh},
		{"UPDATE outbox SET created_at = now() - interval '3 hours' WHERE channel=$1", pendingCh},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.ch); err != nil {
			t.Fatal(err)
		}
	}
	// Everything else in the table is younger than an hour, so only this
	// test's old rows qualify.
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	p, err := store.NewOutboxPurger(st, store.OutboxPurgerConfig{Retention: time.Hour, Batch: 10, Registerer: reg},
		slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	n, err := p.RunOnce(ctx)
	if err != nil || n != 23 {
		t.Fatalf("RunOnce = %d, %v; want the 23 old delivered rows (3 batches)", n, err)
	}
	for ch, want := range map[string]int{oldCh: 0, youngCh: 5, pendingCh: 3} {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE channel=$1", ch).Scan(&left); err != nil || left != want {
			t.Errorf("channel %s: %d rows left (%v), want %d", ch, left, err, want)
		}
	}
	if v := counterValue(t, reg, "han_outbox_purged_total", ""); v != 23 {
		t.Fatalf("han_outbox_purged_total = %v, want 23", v)
	}
	if !strings.Contains(logs.String(), `"rows":3`) || !strings.Contains(logs.String(), "still undelivered") {
		t.Fatalf("old undelivered rows not reported: %s", logs.String())
	}
	if n, err := p.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second run purged %d (%v), want 0", n, err)
	}
}

// One DELETE removes at most a batch, oldest delivery first.
func TestPurgeDeliveredOutboxBatch(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	ch, evs := insertOutbox(t, pool, 7)
	t.Cleanup(func() { // the rows left are a day old: other purge tests would count them
		_, _ = pool.Exec(context.Background(), "DELETE FROM outbox WHERE channel=$1", ch)
	})
	if _, err := pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '1 day',
		delivered_at = now() - interval '1 day' + (id - (SELECT min(id) FROM outbox WHERE channel=$1)) * interval '1 second'
		WHERE channel=$1`, ch); err != nil {
		t.Fatal(err)
	}
	n, err := st.PurgeDeliveredOutbox(ctx, 12*time.Hour, 4)
	if err != nil || n != 4 {
		t.Fatalf("PurgeDeliveredOutbox = %d, %v; want one batch of 4", n, err)
	}
	var left []string
	rows, err := pool.Query(ctx, "SELECT event_id::text FROM outbox WHERE channel=$1 ORDER BY id", ch)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		left = append(left, s)
	}
	if rows.Err() != nil || strings.Join(left, ",") != strings.Join(evs[4:], ",") {
		t.Fatalf("left %v, want the 3 delivered last %v", left, evs[4:])
	}
}

// The purge finds its rows through the partial index on delivered_at: it
// never reads the table in full, however large the outbox grows.
func TestPurgeUsesTheDeliveredIndex(t *testing.T) {
	_, pool := openStore(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the plan is all this test reads
	// A table of 50k delivered rows, analysed, inside a transaction that is
	// rolled back.
	if _, err := tx.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, created_at, delivered_at)
		SELECT gen_random_uuid(), 'han:rt:dialog:plan', '\x00', now() - g * interval '10 ms', now() - g * interval '10 ms'
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "ANALYZE outbox"); err != nil {
		t.Fatal(err)
	}
	plan := explain(t, tx, store.PurgeOutboxSQL, 60, 5000)
	if !strings.Contains(plan, "outbox_delivered_idx") || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the purge does not use outbox_delivered_idx:\n%s", plan)
	}
}
