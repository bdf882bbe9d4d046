package pubsub_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A link busy delivering a flood of messages reads: the canary, published
// meanwhile, waits behind them, however late, but the link is not taken
// for dead. Ending it lost the backlog and resynced every socket of the
// instance, and the flood went on on the next link. A link that reads
// nothing at all is still ended, within the canary deadline.
func TestALinkDeliveringAFloodIsNotTakenForDead(t *testing.T) {
	p, link := proxiedLink(t)
	ch := pubsub.DialogChannel(ids.New())
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	got, resyncs := 0, 0
	s, err := pubsub.NewSubscriber(link, pubsub.SubscriberConfig{InstanceID: "i-" + ids.New()[24:],
		CanaryInterval: 100 * time.Millisecond, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, Registerer: reg}, discard,
		func(channel string, _ []byte) {
			if channel != ch {
				return
			}
			time.Sleep(2 * time.Millisecond) // a receiver slower than the flood
			mu.Lock()
			got++
			mu.Unlock()
		},
		func([]string) { mu.Lock(); resyncs++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	ctx := context.Background()
	if err := s.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, s.Healthy, "subscriber never came up")
	mu.Lock()
	resyncs = 0 // the first link's own
	mu.Unlock()

	// 1000 messages take the receiver over 2 s: seven times the canary
	// deadline (300 ms).
	const n = 1000
	pub := adminPublisher(t, env.Redis, 10*time.Second)
	pipe := pub.Pipeline()
	for i := range n {
		pipe.Publish(ctx, ch, strconv.Itoa(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got == n || resyncs > 0
	}, "the flood was not delivered")
	mu.Lock()
	delivered, resynced := got, resyncs
	mu.Unlock()
	if r := reconnects(t, reg); delivered != n || resynced != 0 || r != 0 {
		t.Fatalf("delivered %d of %d messages, %d resync(s), %v reconnect(s): a link busy reading was taken for dead",
			delivered, n, resynced, r)
	}

	// Silent now: nothing reaches the subscriber.
	p.Blackhole(true)
	testenv.Eventually(t, 10*time.Second, func() bool { return reconnects(t, reg) > 0 },
		"a link that reads nothing was not ended")
	p.Blackhole(false)
	testenv.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return resyncs > 0 },
		"the new link did not resync the channel")
}

// reconnects reads han_pubsub_reconnects_total.
func reconnects(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "han_pubsub_reconnects_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("han_pubsub_reconnects_total not exported")
	return 0
}
