package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// While one master stalls (SIGSTOP: the kernel accepts connections, nothing
// answers) its channels wait for the failover, but a socket subscribing a
// channel of a healthy master must not wait for the stalled one: the
// subscriber's routing ("new subscriptions never wait for them",
// pubsub/sharded.go) runs on the service's client defaults (1 s read
// timeout) and the gateway gives a subscribe SubscribeTimeout (5 s).
func TestAStalledMasterDoesNotDelaySubscribesOnTheOthers(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{NodeTimeout: 15 * time.Second}) // production-like: no failover during the test
	ctx := context.Background()
	rdb, err := rds.NewRedis(c.URL(), rds.RedisConfig{}) // the service's defaults
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	sub, err := pubsub.NewSubscriber(rdb, pubsub.SubscriberConfig{InstanceID: "inst-a", CanaryInterval: 500 * time.Millisecond},
		slog.New(slog.DiscardHandler), func(string, []byte) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub.Start()
	defer sub.Close()
	byMaster := channelsByMaster(t, c, 1)
	victim := masterWithoutCanary(t, c, "inst-a")
	for _, chs := range byMaster {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := sub.Subscribe(sctx, chs[0]); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	// Fresh channels on the healthy masters.
	var fresh []string
	for i := 0; len(fresh) < 40; i++ {
		ch := pubsub.DialogChannel(fmt.Sprintf("00000000-0000-7000-9000-%012x", i))
		m, err := c.MasterOf(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		if m != victim {
			fresh = append(fresh, ch)
		}
	}
	thaw := victim.Freeze(t)
	defer thaw()
	time.Sleep(2 * time.Second) // the watchdog notices the stalled shard (3 × 500 ms)
	var worst time.Duration
	slow := 0
	for _, ch := range fresh[:25] {
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := sub.Subscribe(sctx, ch)
		cancel()
		d := time.Since(start)
		worst = max(worst, d)
		// The bound is the subscribe's own budget with room, far below
		// the failover's 15 s: a slot-map reload the client starts may
		// ask the stalled node first and wait out its 1 s read timeout
		// (twice with the retry), which a loaded machine stretches.
		if err != nil || d > 3*time.Second {
			slow++
			t.Logf("subscribe of %s on a healthy master: %v (%v)", ch, d.Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("worst subscribe latency on healthy masters during the stall: %v", worst)
	if slow > 0 {
		t.Fatalf("%d of 25 subscribes to channels of healthy masters failed or took over 3 s (worst %v) while another master stalled", slow, worst.Round(time.Millisecond))
	}
}
