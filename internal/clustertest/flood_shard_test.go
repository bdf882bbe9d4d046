package clustertest_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A shard connection busy delivering a flood of messages reads: the PONG
// of the PING sent meanwhile waits behind them, however late, but the
// connection is not taken for dead. Ending it lost the backlog and
// resynced every socket of the shard's channels, and the flood went on on
// the next connection. A connection that reads nothing at all (its master
// stalled) is still ended, within the canary deadline.
func TestAShardDeliveringAFloodIsNotTakenForDead(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{NodeTimeout: 15 * time.Second})
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	victim := masterWithoutCanary(t, c, "inst-flood")
	ch := channelsByMaster(t, c, 1)[victim.Addr()][0]
	var mu sync.Mutex
	got, resyncs := 0, 0
	sub, err := pubsub.NewSubscriber(open(t, c), pubsub.SubscriberConfig{InstanceID: "inst-flood",
		CanaryInterval: 100 * time.Millisecond, Registerer: reg}, slog.New(slog.DiscardHandler),
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
	sub.Start()
	t.Cleanup(sub.Close)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sub.Subscribe(sctx, ch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, sub.Healthy, "subscriber never came up")

	// 1000 messages take the receiver over 2 s: seven times the canary
	// deadline (300 ms).
	const n = 1000
	admin := victim.AdminClient(0)
	defer admin.Close()
	pipe := admin.Pipeline()
	for i := range n {
		pipe.SPublish(ctx, ch, strconv.Itoa(i))
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
	if r := counterValue(t, reg, "han_pubsub_reconnects_total"); delivered != n || resynced != 0 || r != 0 {
		t.Fatalf("delivered %d of %d messages, %d resync(s), %v reconnect(s): a shard connection busy reading was taken for dead",
			delivered, n, resynced, r)
	}

	thaw := victim.Freeze(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return counterValue(t, reg, "han_pubsub_reconnects_total") > 0 },
		"the connection to a stalled master was not ended")
	thaw()
	testenv.Eventually(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return resyncs > 0 },
		"the channel was not resynced once its master answered again")
}

// counterValue reads the unlabelled counter name from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}
