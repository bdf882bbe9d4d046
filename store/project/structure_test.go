package project_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/store/project"
)

// The publish, claim and ack scripts read every key before they write any:
// a key of the wrong type (here a STRING) in place of any key they use is
// data_state_invalid, and nothing is written (the module budget included).
func TestQueueWrongTypeKeysWriteNothing(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	ctx := context.Background()
	type fixture struct {
		q    *project.Queue
		tp   leaseTopic
		held project.ClaimItem
	}
	// newFixture: a topic with one subscription, a processed, a leased and
	// a pending message, and a lease on the module budget already held.
	newFixture := func(t *testing.T) fixture {
		q := e.queue(project.QueueConfig{})
		tp := e.topic(q)
		for _, ev := range []string{"a", "b", "c"} {
			if err := publishOne(q, tp, ev); err != nil {
				t.Fatal(err)
			}
		}
		items, err := q.Claim(ctx, tp.k, tp.sid, 1, false)
		if err != nil || len(items) != 1 {
			t.Fatal(items, err)
		}
		if _, _, err := q.Ack(ctx, tp.k, tp.sid, items[0].Message.ID, items[0].Token, "processed", ""); err != nil {
			t.Fatal(err)
		}
		items, err = q.Claim(ctx, tp.k, tp.sid, 1, false)
		if err != nil || len(items) != 1 {
			t.Fatal(items, err)
		}
		return fixture{q: q, tp: tp, held: items[0]}
	}
	publish := func(f fixture) error { return publishOne(f.q, f.tp, "new") }
	claim := func(f fixture) error { _, err := f.q.Claim(ctx, f.tp.k, f.tp.sid, 5, false); return err }
	ack := func(f fixture) error {
		_, _, err := f.q.Ack(ctx, f.tp.k, f.tp.sid, f.held.Message.ID, f.held.Token, "processed", "")
		return err
	}
	cases := []struct {
		name string
		key  func(f fixture) string
		op   func(f fixture) error
	}{
		{"publish: topics", func(f fixture) string { return f.tp.k.Topics() }, publish},
		{"publish: budget", func(f fixture) string { return f.tp.k.Budget() }, publish},
		{"publish: dedupe records", func(f fixture) string { return f.tp.k.Dedupe() }, publish},
		{"publish: dedupe expiry", func(f fixture) string { return f.tp.k.DedupeExpiry() }, publish},
		{"publish: stream", func(f fixture) string { return f.tp.k.TopicStream(f.tp.tid) }, publish},
		{"publish: topic subscriptions", func(f fixture) string { return f.tp.k.TopicSubscriptions(f.tp.tid) }, publish},
		{"publish: open counts", func(f fixture) string { return f.tp.k.TopicOpen(f.tp.tid) }, publish},
		{"publish: receipts", func(f fixture) string { return f.tp.k.Receipts(f.tp.sid) }, publish},
		{"claim: topics", func(f fixture) string { return f.tp.k.Topics() }, claim},
		{"claim: subscriptions", func(f fixture) string { return f.tp.k.Subscriptions() }, claim},
		{"claim: stream", func(f fixture) string { return f.tp.k.TopicStream(f.tp.tid) }, claim},
		{"claim: open counts", func(f fixture) string { return f.tp.k.TopicOpen(f.tp.tid) }, claim},
		{"claim: receipts", func(f fixture) string { return f.tp.k.Receipts(f.tp.sid) }, claim},
		{"claim: leases", func(f fixture) string { return f.tp.k.Leases(f.tp.sid) }, claim},
		{"ack: subscriptions", func(f fixture) string { return f.tp.k.Subscriptions() }, ack},
		{"ack: open counts", func(f fixture) string { return f.tp.k.TopicOpen(f.tp.tid) }, ack},
		{"ack: done", func(f fixture) string { return f.tp.k.TopicDone(f.tp.tid) }, ack},
		{"ack: receipts", func(f fixture) string { return f.tp.k.Receipts(f.tp.sid) }, ack},
		{"ack: leases", func(f fixture) string { return f.tp.k.Leases(f.tp.sid) }, ack},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			plant(t, e, c.key(f))
			before := dumpKeys(t, e.admin, f.tp.k.Prefix(), e.mk.Prefix())
			if err := c.op(f); !errors.Is(err, project.ErrDataStateInvalid) {
				t.Fatalf("got %v, want data_state_invalid", err)
			}
			if dumpKeys(t, e.admin, f.tp.k.Prefix(), e.mk.Prefix()) != before {
				t.Fatal("a refused call wrote to Redis")
			}
		})
	}

	// The keys a script writes only on some paths: the done set of a topic
	// without subscriptions (publish) and of a receipt whose last attempt
	// expires (claim).
	t.Run("publish: done", func(t *testing.T) {
		q := e.queue(project.QueueConfig{})
		tp := e.topic(q)
		if err := q.DeleteSubscription(ctx, tp.k, tp.pid, tp.sid); err != nil {
			t.Fatal(err)
		}
		if err := publishOne(q, tp, "warm"); err != nil {
			t.Fatal(err)
		}
		plant(t, e, tp.k.TopicDone(tp.tid))
		before := dumpKeys(t, e.admin, tp.k.Prefix(), e.mk.Prefix())
		if err := publishOne(q, tp, "new"); !errors.Is(err, project.ErrDataStateInvalid) {
			t.Fatalf("got %v, want data_state_invalid", err)
		}
		if dumpKeys(t, e.admin, tp.k.Prefix(), e.mk.Prefix()) != before {
			t.Fatal("a refused call wrote to Redis")
		}
	})
	t.Run("claim: done", func(t *testing.T) {
		q := e.queue(project.QueueConfig{Lease: 5 * time.Millisecond})
		tp := e.topic(q)
		if err := publishOne(q, tp, "one"); err != nil {
			t.Fatal(err)
		}
		for range project.ReceiptMaxAttempts {
			if items, err := q.Claim(ctx, tp.k, tp.sid, 1, false); err != nil || len(items) != 1 {
				t.Fatal(items, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		plant(t, e, tp.k.TopicDone(tp.tid))
		before := dumpKeys(t, e.admin, tp.k.Prefix(), e.mk.Prefix())
		if _, err := q.Claim(ctx, tp.k, tp.sid, 1, false); !errors.Is(err, project.ErrDataStateInvalid) {
			t.Fatalf("got %v, want data_state_invalid", err)
		}
		if dumpKeys(t, e.admin, tp.k.Prefix(), e.mk.Prefix()) != before {
			t.Fatal("a refused call wrote to Redis")
		}
	})
}

// plant replaces key with a STRING.
func plant(t *testing.T, e *leaseEnv, key string) {
	t.Helper()
	ctx := context.Background()
	if err := e.admin.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.Set(ctx, key, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// Claim's tokens are distinct, 43 characters long, and each one acknowledges
// its own message (its hash, LeaseTokenHash, is what the receipt holds).
func TestClaimTokensHashAsAcked(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	for _, ev := range []string{"a", "b", "c"} {
		if err := publishOne(q, tp, ev); err != nil {
			t.Fatal(err)
		}
	}
	items, err := q.Claim(context.Background(), tp.k, tp.sid, project.ClaimCountMax, false)
	if err != nil || len(items) != 3 {
		t.Fatal(items, err)
	}
	seen := map[string]bool{}
	for _, it := range items {
		if len(it.Token) != 43 || seen[it.Token] {
			t.Fatalf("token %q", it.Token)
		}
		seen[it.Token] = true
		if _, _, err := q.Ack(context.Background(), tp.k, tp.sid, it.Message.ID, it.Token, "processed", ""); err != nil {
			t.Fatal(err)
		}
	}
}
