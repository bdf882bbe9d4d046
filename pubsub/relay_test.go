package pubsub_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

func openStore(t *testing.T) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return store.New(pool), pool
}

// received collects every payload published on a channel, by event id.
type received struct {
	mu   sync.Mutex
	byID map[string][]string
}

func listen(t *testing.T, channel string) *received {
	t.Helper()
	r := &received{byID: map[string][]string{}}
	s, err := pubsub.NewSubscriber(rtClient(t), pubsub.SubscriberConfig{InstanceID: "listen-" + ids.New()[24:]}, discard,
		func(_ string, p []byte) {
			var ev pubsub.Event
			if err := json.Unmarshal(p, &ev); err != nil {
				t.Errorf("undecodable event: %v", err)
				return
			}
			r.mu.Lock()
			r.byID[ev.ID] = append(r.byID[ev.ID], string(p))
			r.mu.Unlock()
		}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Close)
	if err := s.Subscribe(context.Background(), channel); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *received) snapshot() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	for k, v := range r.byID {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// postWithDeadRedis sends n messages the way the send path does — the
// message and its outbox event in one transaction (store.SendMessage with
// Event), then the publish after commit — with DB1 a stopped Redis: every
// publish fails, so no row is marked delivered and every outbox row stays
// pending.
func postWithDeadRedis(t *testing.T, st *store.Store, pool *pgxpool.Pool, n int) (dialogID string) {
	t.Helper()
	ctx := context.Background()
	dead, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dead.Stop()
	rt, err := rds.NewRedis(dead.URL(1), rds.RedisConfig{DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	pub := pubsub.NewPublisher(rt, rds.PubSubAuto, nil, nil)
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), a, "", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		_, ev, created, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: a,
			Body: fmt.Sprintf("m%d", i), Event: true})
		if err != nil || !created || ev.EventID == "" {
			t.Fatalf("send %d: created %v event %q: %v", i, created, ev.EventID, err)
		}
		if err := pub.Publish(ctx, ev.Channel, ev.Payload); err == nil {
			t.Fatalf("send %d: the publish to a stopped Redis succeeded", i)
		}
	}
	return d.ID
}

func pendingFor(t *testing.T, pool *pgxpool.Pool, channel string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE channel=$1 AND delivered_at IS NULL", channel).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// With the publish after commit failing, three relays running at once
// deliver every message exactly once (SKIP LOCKED: one relay per row at a
// time); a forced re-publish carries the same event id and bytes.
func TestRelayDeliversWhatThePublishMissed(t *testing.T) {
	st, pool := openStore(t)
	const n = 30
	d := postWithDeadRedis(t, st, pool, n)
	ch := pubsub.DialogChannel(d)
	if got := pendingFor(t, pool, ch); got != n {
		t.Fatalf("%d outbox rows pending after failed publishes, want %d", got, n)
	}
	rec := listen(t, ch)

	var relays []*pubsub.Relay
	for i := 0; i < 3; i++ {
		r, err := pubsub.NewRelay(st, rtClient(t), pubsub.RelayConfig{Grace: time.Millisecond, Batch: 4, Interval: 20 * time.Millisecond}, discard)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	for _, r := range relays {
		r.Start()
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return pendingFor(t, pool, ch) == 0 }, "relays did not deliver everything")
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.snapshot()) == n }, "not every event arrived")
	for _, r := range relays {
		r.Close()
	}
	got := rec.snapshot()
	// Each event is the message.created frame of its stored message under
	// the outbox row's event id.
	rows, err := pool.Query(context.Background(), `SELECT o.event_id::text, m.id::text, m.dialog_id::text, m.seq,
		m.sender_id::text, m.body, m.created_at FROM outbox o JOIN messages m ON m.id = o.message_id WHERE o.channel=$1`, ch)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for rows.Next() {
		var id string
		var m pubsub.Message
		var at time.Time
		if err := rows.Scan(&id, &m.ID, &m.DialogID, &m.Seq, &m.SenderID, &m.Body, &at); err != nil {
			t.Fatal(err)
		}
		m.CreatedAt, m.Attachments = at.UnixMilli(), []pubsub.Attachment{}
		frame, err := pubsub.MessageCreated(id, m)
		if err != nil {
			t.Fatal(err)
		}
		want[id] = string(frame)
	}
	rows.Close()
	if len(want) != n {
		t.Fatalf("%d message.created rows, want %d", len(want), n)
	}
	for id, p := range want {
		if len(got[id]) != 1 {
			t.Fatalf("event %s published %d times by 3 relays, want once", id, len(got[id]))
		}
		if got[id][0] != p {
			t.Fatalf("published bytes differ from the stored message's frame:\n%s\n%s", got[id][0], p)
		}
	}

	// A row published but not marked (a crash before commit) goes out
	// again: same event id, same bytes.
	var dup string
	if err := pool.QueryRow(context.Background(), `UPDATE outbox SET delivered_at = NULL
		WHERE id = (SELECT min(id) FROM outbox WHERE channel=$1) RETURNING event_id::text`, ch).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	// RunOnce publishes nothing while another relay's lock is still held
	// (its release can lag on a loaded machine), so it is retried.
	var published int
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, n, err := relays[0].RunOnce(context.Background())
		if err != nil {
			t.Fatalf("re-publish: %v", err)
		}
		published += n
		return published > 0
	}, "the unmarked row was not published again")
	if published != 1 {
		t.Fatalf("re-publish: %d rows, want 1", published)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.snapshot()[dup]) == 2 }, "duplicate not received")
	if c := rec.snapshot()[dup]; c[0] != c[1] {
		t.Fatal("a duplicate must carry the same event id and bytes")
	}
}

// A held delivery lock skips its row (another holder is publishing it);
// the row goes out once the lock is free. Young rows belong to the request
// path and are left alone.
func TestRelayHonoursLockAndGrace(t *testing.T) {
	ctx := context.Background()
	st, pool := openStore(t)
	d := postWithDeadRedis(t, st, pool, 2)
	ch := pubsub.DialogChannel(d)
	rec := listen(t, ch)
	young, err := pubsub.NewRelay(st, rtClient(t), pubsub.RelayConfig{Grace: time.Hour}, discard)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, _, err := young.RunOnce(ctx); err != nil || claimed != 0 {
		t.Fatalf("rows younger than the grace were claimed: %d %v", claimed, err)
	}
	var first string
	if err := pool.QueryRow(ctx, "SELECT entity_id FROM outbox WHERE channel=$1 ORDER BY id LIMIT 1", ch).Scan(&first); err != nil {
		t.Fatal(err)
	}
	lk, _, err := rds.NewLocker(rtClient(t)).Acquire(ctx, rds.LockDelivery, first, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r, err := pubsub.NewRelay(st, rtClient(t), pubsub.RelayConfig{Grace: time.Millisecond}, discard)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, published, err := r.RunOnce(ctx); err != nil || claimed != 2 || published != 1 {
		t.Fatalf("with one row's lock held: claimed %d published %d (%v)", claimed, published, err)
	}
	if pendingFor(t, pool, ch) != 1 {
		t.Fatal("the locked row must stay pending")
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, published, err := r.RunOnce(ctx); err != nil || published != 1 {
		t.Fatalf("after release: %d %v", published, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.snapshot()) == 2 }, "events missing")
}
