package project_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// A claim whose round trip times out is not sent again: go-redis retried a
// pipeline once on a read timeout, and Redis, stalled a little longer than
// the budget, ran the claim twice — the caller got the second run's
// leases, and the first run's were held by nobody with the very same
// token hashes, so a message the caller was never shown stayed locked for
// a whole lease and the caller's token acknowledged it. Run once, a claim
// whose reply was lost holds one message for one lease; the other pending
// message is the next claim's.
func TestAStalledClaimRunsOnce(t *testing.T) {
	const budget = 500 * time.Millisecond
	rs, e, q, tp := stalledQueue(t, budget, 64<<20, project.QueueConfig{})
	admin := e.admin
	ctx := context.Background()
	for _, ev := range []string{"m1", "m2"} {
		if err := publishOne(q, tp, ev); err != nil {
			t.Fatal(err)
		}
	}
	// Load the claim script with a claim that finds nothing.
	other, err := q.CreateSubscription(ctx, tp.k, ids.New(), tp.tid, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if items, err := q.Claim(ctx, tp.k, other.ID, 1, false); err != nil || len(items) != 0 {
		t.Fatalf("warm claim: %v %v", items, err)
	}

	thaw := rs.Freeze(t)
	type result struct {
		items []project.ClaimItem
		err   error
	}
	done := make(chan result, 1)
	go func() {
		items, err := q.Claim(ctx, tp.k, tp.sid, 1, false)
		done <- result{items, err}
	}()
	// Past the first attempt's deadline, well inside the retry's.
	time.Sleep(budget + budget/3)
	thaw()
	r := <-done
	var got project.ClaimItem
	switch {
	case r.err != nil:
		// Unanswered: the claim ran when Redis woke, its reply discarded.
		if !errors.Is(r.err, rds.ErrRedisUnavailable) {
			t.Fatalf("the stalled claim failed with %v, want redis unavailable", r.err)
		}
	case len(r.items) != 1:
		t.Fatalf("claim answered %d items, want 1", len(r.items))
	default:
		got = r.items[0]
	}

	// Two messages were pending and the caller was shown one: the other
	// is still there for the next claim.
	next, err := q.Claim(ctx, tp.k, tp.sid, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(next) != 1 {
		// The token the caller holds for its one message: does it also
		// acknowledge the message nobody was shown?
		var hidden string
		for _, m := range admin.XRange(ctx, tp.k.TopicStream(tp.tid), "-", "+").Val() {
			if m.ID != got.Message.ID {
				hidden = m.ID
			}
		}
		_, _, ackErr := q.Ack(ctx, tp.k, tp.sid, hidden, got.Token, "processed", "")
		t.Fatalf("after a claim answered with %q (err %v), the next claim got %d items (want the other pending message %s); "+
			"that message is leased to nobody (receipt %s), and acking it with the token issued for %s gives err=%v (want lease_token_mismatch)",
			got.Message.ID, r.err, len(next), hidden, admin.HGet(ctx, tp.k.Receipts(tp.sid), hidden).Val(), got.Message.ID, ackErr)
	}
	if next[0].Message.ID == got.Message.ID {
		t.Fatal("the same message was leased twice")
	}
}

// A publish whose round trip times out is not sent again either: when it
// was, the first run created the message and the retry, the run whose
// reply arrived, found its own dedupe record and answered "replay" with no
// bytes added — the caller's first publish of a fresh identity was
// reported as a replay (200, not 201), and the module lease gave back the
// bytes the first run kept, so later publishes filled the module past its
// cap. Run once and unanswered, its bytes stay counted.
func TestAStalledPublishRunsOnceAndKeepsTheModuleCap(t *testing.T) {
	const budget = 500 * time.Millisecond
	rs, e, q, tp := stalledModule(t, budget)
	thaw := rs.Freeze(t)
	type result struct {
		replay bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		_, replay, err := q.Publish(context.Background(), tp.k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p",
			ClientEventID: "fresh", Payload: []byte(`{"body":"` + strings.Repeat("x", 200) + `"}`)})
		done <- result{replay, err}
	}()
	time.Sleep(budget + budget/3)
	thaw()
	r := <-done
	if r.err != nil && !errors.Is(r.err, rds.ErrRedisUnavailable) {
		t.Fatalf("the stalled publish failed with %v, want redis unavailable", r.err)
	}
	n, sum := fillModule(t, e, q, tp)
	if r.replay || sum > stalledModuleCap {
		t.Fatalf("first publish of a fresh identity answered replay=%v err=%v (want a new message or unanswered); after %d more publishes the project holds %d bytes, module cap %d",
			r.replay, r.err, n, sum, stalledModuleCap)
	}
}

// Against a stalled Redis every claim fails within its Redis budget, from
// the moment it queued for a shared round trip: concurrent claims of one
// subscription queue behind each other (one round trip in flight), and a
// queued one used to wait for each stalled batch ahead of it — with 150
// callers the last answered only after several budgets.
func TestStalledClaimsEndWithinTheirBudget(t *testing.T) {
	const budget = 300 * time.Millisecond
	rs, _, q, tp := stalledQueue(t, budget, 64<<20, project.QueueConfig{RedisBudget: budget})
	ctx := context.Background()
	if _, err := q.Claim(ctx, tp.k, tp.sid, 1, false); err != nil {
		t.Fatal(err)
	}
	thaw := rs.Freeze(t)
	defer thaw()
	const n = 150
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = q.Claim(ctx, tp.k, tp.sid, 1, false)
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	thaw()
	for i, err := range errs {
		if err == nil {
			t.Fatalf("claim %d succeeded against a stopped Redis", i)
		}
	}
	slices.Sort(took)
	if took[n-1] > 2*budget {
		t.Fatalf("against a stalled Redis the slowest of %d concurrent claims failed after %v (fastest %v, median %v); Redis budget %v",
			n, took[n-1], took[0], took[n/2], budget)
	}
}
