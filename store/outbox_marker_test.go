package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// insertOutbox inserts n undelivered outbox rows on a channel of their own
// and returns their event ids in id order.
func insertOutbox(t testing.TB, pool *pgxpool.Pool, n int) (channel string, eventIDs []string) {
	t.Helper()
	channel = "han:rt:dialog:" + ids.New()
	eventIDs = make([]string, n)
	for i := range eventIDs {
		eventIDs[i] = ids.New()
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox(event_id, channel, payload, entity_id)
		SELECT e, $1, convert_to(e::text, 'UTF8'), e::text FROM unnest($2::uuid[]) WITH ORDINALITY AS u(e, o) ORDER BY o`,
		channel, eventIDs); err != nil {
		t.Fatal(err)
	}
	return channel, eventIDs
}

// outboxState counts a channel's delivered rows and their distinct
// delivered_at values (now() is the time of the statement's transaction, so
// rows marked by one UPDATE share one value).
func outboxState(t testing.TB, pool *pgxpool.Pool, channel string) (delivered, stamps, pending int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(delivered_at), count(DISTINCT delivered_at),
		count(*) FILTER (WHERE delivered_at IS NULL) FROM outbox WHERE channel=$1`, channel).Scan(&delivered, &stamps, &pending); err != nil {
		t.Fatal(err)
	}
	return delivered, stamps, pending
}

// counterValue reads a counter (with the given label value, if any) from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{%s} not found", name, label)
	return 0
}

// A full batch is marked at once, by one UPDATE: every row of it carries the
// same delivered_at. Fewer ids than a batch wait for the interval.
func TestOutboxMarkerFlushesAFullBatchInOneStatement(t *testing.T) {
	st, pool := openStore(t)
	reg := prometheus.NewRegistry()
	m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{Batch: 100, Interval: time.Hour, Registerer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ch, evs := insertOutbox(t, pool, 150)
	var wg sync.WaitGroup
	for w := range 10 { // published by concurrent requests
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, id := range evs[w*10 : w*10+10] {
				m.Mark(id)
			}
		}()
	}
	wg.Wait()
	testenv.Eventually(t, 5*time.Second, func() bool { d, _, _ := outboxState(t, pool, ch); return d == 100 },
		"a full batch was not marked")
	for _, id := range evs[100:] {
		m.Mark(id)
	}
	time.Sleep(50 * time.Millisecond)
	if d, stamps, pending := outboxState(t, pool, ch); d != 100 || stamps != 1 || pending != 50 {
		t.Fatalf("delivered %d (in %d statements), pending %d; want 100 in 1, 50 pending until the interval", d, stamps, pending)
	}
	if v := counterValue(t, reg, "han_outbox_marks_total", ""); v != 100 {
		t.Fatalf("han_outbox_marks_total = %v, want 100", v)
	}
}

// Ids fewer than a batch are marked once the interval passed since the
// first of them, in one statement, and the marker's goroutine then ends.
func TestOutboxMarkerFlushesAfterTheInterval(t *testing.T) {
	st, pool := openStore(t)
	m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{Interval: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ch, evs := insertOutbox(t, pool, 30)
	for _, id := range evs {
		m.Mark(id)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { d, _, _ := outboxState(t, pool, ch); return d == 30 },
		"queued marks were not flushed after the interval")
	if _, stamps, _ := outboxState(t, pool, ch); stamps != 1 {
		t.Fatalf("30 marks queued together took %d statements, want 1", stamps)
	}
	// An idle marker keeps going: a later mark is flushed as well.
	ch2, evs2 := insertOutbox(t, pool, 1)
	m.Mark(evs2[0])
	testenv.Eventually(t, 5*time.Second, func() bool { d, _, _ := outboxState(t, pool, ch2); return d == 1 },
		"a mark after an idle period was not flushed")
}

// Close flushes what is queued before it returns; a mark after Close is
// dropped and counted (the relay republishes that row).
func TestOutboxMarkerCloseFlushes(t *testing.T) {
	st, pool := openStore(t)
	reg := prometheus.NewRegistry()
	m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{Batch: 1000, Interval: time.Hour, Registerer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, evs := insertOutbox(t, pool, 11)
	for _, id := range evs[:10] {
		m.Mark(id)
	}
	if d, _, _ := outboxState(t, pool, ch); d != 0 {
		t.Fatalf("%d rows marked before the interval or a full batch", d)
	}
	m.Close()
	if d, _, pending := outboxState(t, pool, ch); d != 10 || pending != 1 {
		t.Fatalf("after Close: %d delivered, %d pending; want 10 and 1", d, pending)
	}
	m.Mark(evs[10])
	m.Close()
	if v := counterValue(t, reg, "han_outbox_marks_dropped_total", "closed"); v != 1 {
		t.Fatalf("marks dropped after Close = %v, want 1", v)
	}
	if _, _, pending := outboxState(t, pool, ch); pending != 1 {
		t.Fatal("a mark after Close reached the database")
	}
}

// With the queue full a mark is dropped, never waited for; the row stays
// undelivered (for the relay) and the drop is counted.
func TestOutboxMarkerDropsWhenTheQueueIsFull(t *testing.T) {
	st, pool := openStore(t)
	reg := prometheus.NewRegistry()
	m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{Batch: 100, Queue: 4, Interval: time.Hour, Registerer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, evs := insertOutbox(t, pool, 10)
	for _, id := range evs {
		m.Mark(id)
	}
	m.Close()
	if d, _, pending := outboxState(t, pool, ch); d != 4 || pending != 6 {
		t.Fatalf("%d delivered, %d pending; want the 4 queued delivered and 6 pending", d, pending)
	}
	if v := counterValue(t, reg, "han_outbox_marks_dropped_total", "queue_full"); v != 6 {
		t.Fatalf("han_outbox_marks_dropped_total{reason=queue_full} = %v, want 6", v)
	}
	var first int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE event_id = ANY($1::uuid[]) AND delivered_at IS NOT NULL",
		evs[:4]).Scan(&first); err != nil || first != 4 {
		t.Fatalf("the first 4 marks must be the ones kept: %d %v", first, err)
	}
}

// A row the relay delivered first keeps its delivery: the mark changes
// neither its delivered_at nor its attempts.
func TestOutboxMarkLeavesDeliveredRows(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	ch, evs := insertOutbox(t, pool, 2)
	if _, err := pool.Exec(ctx, "UPDATE outbox SET delivered_at = now() - interval '1 minute', attempts = 1 WHERE event_id=$1", evs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkOutboxDeliveredBatch(ctx, evs); err != nil {
		t.Fatal(err)
	}
	var attempts, old int
	if err := pool.QueryRow(ctx, `SELECT sum(attempts), count(*) FILTER (WHERE delivered_at < now() - interval '30 seconds')
		FROM outbox WHERE channel=$1`, ch).Scan(&attempts, &old); err != nil || attempts != 2 || old != 1 {
		t.Fatalf("attempts %d, rows keeping the relay's delivery %d (%v); want 2 and 1", attempts, old, err)
	}
}

// The batched mark finds its rows through the event_id index however many
// rows are pending, never by reading every undelivered row.
func TestMarkUsesTheEventIDIndex(t *testing.T) {
	_, pool := openStore(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the plan is all this test reads
	// 100k pending rows, as a relay backlog after a Redis outage leaves
	// (the outbox holds HAN_OUTBOX_RETENTION of traffic: 900k rows at
	// 1,000 messages a second).
	if _, err := tx.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload)
		SELECT gen_random_uuid(), 'han:rt:dialog:plan', '\x00' FROM generate_series(1, 100000)`); err != nil {
		t.Fatal(err)
	}
	var evs []string
	rows, err := tx.Query(ctx, "SELECT event_id::text FROM outbox WHERE channel='han:rt:dialog:plan' LIMIT 256")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, s)
	}
	plan := explain(t, tx, store.MarkOutboxSQL, evs)
	if !strings.Contains(plan, "outbox_event_id_key") || strings.Contains(plan, "outbox_pending_idx") || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the mark does not probe the event_id index:\n%s", plan)
	}
}

// explain returns the plan of q.
func explain(t *testing.T, tx pgx.Tx, q string, args ...any) string {
	t.Helper()
	var plan strings.Builder
	rows, err := tx.Query(context.Background(), "EXPLAIN "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan.String()
}
