package rds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

// A publish whose reply is late past the budget is not sent again: go-redis
// retried a command once after a read timeout, and Redis, stalled a little
// longer than the budget, then ran both copies — every subscriber got the
// event twice. Direct and through a Batcher, alone and sharing a pipeline:
// each reaches subscribers at most once, and exactly once when answered.
func TestAStalledPublishReachesSubscribersOnce(t *testing.T) {
	const budget = 400 * time.Millisecond
	rs, rdb := testenv.StallableRedis(t, 1, budget)
	admin := rs.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	sub := admin.Subscribe(ctx, "han:rt:once")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	b := rds.NewBatcher(rdb)
	t.Cleanup(b.Close)
	direct := func(p string) error { return rds.Publish(ctx, rdb, rds.PubSubAuto, "han:rt:once", []byte(p)).Err() }
	batched := func(p string) error { return b.Publish(ctx, rds.PubSubAuto, "han:rt:once", []byte(p)).Err() }
	cases := []struct {
		name     string
		publish  func(string) error
		payloads []string
	}{
		{"direct", direct, []string{"direct"}},
		{"batcher", batched, []string{"batcher"}},
		{"batcher-shared", batched, []string{"shared-0", "shared-1", "shared-2"}},
	}
	for _, c := range cases {
		testenv.WarmPool(t, rdb)
		thaw := rs.Freeze(t)
		errs := make(chan error, len(c.payloads))
		for _, p := range c.payloads {
			go func() { errs <- c.publish(p) }()
		}
		time.Sleep(budget + budget/3) // past the first attempt, inside a retry's
		thaw()
		answered := 0
		for range c.payloads {
			if err := <-errs; err == nil {
				answered++
			}
		}
		// A marker published after them arrives after them.
		if err := admin.Publish(ctx, "han:rt:once", "marker").Err(); err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for {
			m, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m.Payload == "marker" {
				break
			}
			got[m.Payload]++
		}
		delivered := 0
		for _, p := range c.payloads {
			if got[p] > 1 {
				t.Errorf("%s: %q reached the subscriber %d times (got %v)", c.name, p, got[p], got)
			}
			delivered += got[p]
		}
		if delivered < answered {
			t.Errorf("%s: %d publishes answered, %d delivered (got %v)", c.name, answered, delivered, got)
		}
		t.Logf("%s: %d of %d answered, delivered %v", c.name, answered, len(c.payloads), fmt.Sprint(got))
	}
}
