package pubsub_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// markTest is a store, a channel with outbox rows on it and a raw Redis
// subscription counting what arrives on that channel.
type markTest struct {
	t      *testing.T
	st     *store.Store
	pool   *pgxpool.Pool
	ch     string
	events []string // event ids in outbox order; each row's payload is its id

	mu  sync.Mutex
	got map[string]int
}

func newMarkTest(t *testing.T, n int) *markTest {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	mt := &markTest{t: t, st: store.New(pool), pool: pool, ch: pubsub.DialogChannel(ids.New()), got: map[string]int{}}
	mt.events = make([]string, n)
	for i := range mt.events {
		mt.events[i] = ids.New()
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, entity_id)
		SELECT e, $1, convert_to(e::text, 'UTF8'), e::text FROM unnest($2::uuid[]) WITH ORDINALITY AS u(e, o) ORDER BY o`,
		mt.ch, mt.events); err != nil {
		t.Fatal(err)
	}
	sub := rtClient(t).Subscribe(ctx, mt.ch)
	if _, err := sub.Receive(ctx); err != nil { // the subscription is confirmed
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range sub.Channel() {
			mt.mu.Lock()
			mt.got[m.Payload]++
			mt.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = sub.Close(); <-done })
	return mt
}

// publish does what the request path does after its commit: PUBLISH, then
// queue the delivered mark.
func (mt *markTest) publish(rdb redis.UniversalClient, m *store.OutboxMarker) {
	for _, id := range mt.events {
		if err := rdb.Publish(context.Background(), mt.ch, id).Err(); err != nil {
			mt.t.Fatal(err)
		}
		m.Mark(id)
	}
}

func (mt *markTest) received() map[string]int {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	out := make(map[string]int, len(mt.got))
	for k, v := range mt.got {
		out[k] = v
	}
	return out
}

// relayPastGrace makes every row of the channel older than any grace, runs
// a relay with a 1 ms grace until it finds nothing more (rows other tests
// left pending go out too) and returns the attempts of the channel's rows
// in outbox order: the request path's mark counts one, each relay publish
// one more.
func (mt *markTest) relayPastGrace() []int {
	mt.t.Helper()
	ctx := context.Background()
	if _, err := mt.pool.Exec(ctx, "UPDATE outbox SET created_at = now() - interval '1 hour' WHERE channel=$1", mt.ch); err != nil {
		mt.t.Fatal(err)
	}
	r, err := pubsub.NewRelay(mt.st, rtClient(mt.t), pubsub.RelayConfig{Grace: time.Millisecond, Batch: 1000}, discard)
	if err != nil {
		mt.t.Fatal(err)
	}
	for {
		claimed, _, err := r.RunOnce(ctx)
		if err != nil {
			mt.t.Fatal(err)
		}
		if claimed < 1000 {
			break
		}
	}
	var attempts []int
	if err := mt.pool.QueryRow(ctx, `SELECT array_agg(attempts ORDER BY id) FROM outbox
		WHERE channel=$1 AND delivered_at IS NOT NULL`, mt.ch).Scan(&attempts); err != nil {
		mt.t.Fatal(err)
	}
	return attempts
}

// Rows the request path published and the batched marker recorded are
// delivered after the flush, and the relay never publishes them again:
// every event arrives exactly once.
func TestMarkedRowsAreNotRepublished(t *testing.T) {
	mt := newMarkTest(t, 40)
	rdb := rtClient(t)
	m, err := store.NewOutboxMarker(mt.st, store.OutboxMarkerConfig{}, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mt.publish(rdb, m)
	testenv.Eventually(t, 5*time.Second, func() bool {
		var pending int
		_ = mt.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE channel=$1 AND delivered_at IS NULL", mt.ch).Scan(&pending)
		return pending == 0
	}, "marked rows were not delivered within the flush interval")
	if a := mt.relayPastGrace(); fmt.Sprint(a) != fmt.Sprint(slices.Repeat([]int{1}, len(mt.events))) {
		t.Fatalf("attempts per row %v: the relay published rows the request path had published and marked", a)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(mt.received()) == len(mt.events) }, "events missing")
	time.Sleep(100 * time.Millisecond) // a republished copy would arrive by now
	for id, n := range mt.received() {
		if n != 1 {
			t.Fatalf("event %s received %d times, want once", id, n)
		}
	}
}

// A mark dropped because the queue was full leaves its row undelivered;
// the relay publishes it again after the grace, with the same event id, and
// marks it delivered: delivery stays at least once.
func TestDroppedMarksAreRepublishedByTheRelay(t *testing.T) {
	mt := newMarkTest(t, 5)
	rdb := rtClient(t)
	m, err := store.NewOutboxMarker(mt.st, store.OutboxMarkerConfig{Queue: 2, Batch: 100, Interval: time.Hour}, discard)
	if err != nil {
		t.Fatal(err)
	}
	mt.publish(rdb, m)
	m.Close() // flushes the two marks the queue held
	if a := mt.relayPastGrace(); fmt.Sprint(a) != "[1 1 1 1 1]" {
		t.Fatalf("attempts per row %v, want every row delivered once by its path: 2 marked, 3 relayed", a)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		got := mt.received()
		return got[mt.events[0]] == 1 && got[mt.events[1]] == 1 &&
			got[mt.events[2]] == 2 && got[mt.events[3]] == 2 && got[mt.events[4]] == 2
	}, "want the 2 marked events once and the 3 dropped twice")
	var pending int
	if err := mt.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE channel=$1 AND delivered_at IS NULL", mt.ch).Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("%d rows still pending after the relay (%v)", pending, err)
	}
}
