package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// While one master stalls (SIGSTOP: the kernel accepts connections, nothing
// answers) its channels wait for the failover, but a socket subscribing a
// channel of a healthy master must not wait for the stalled one: the
// subscriber's routing ("new subscriptions never wait for them",
// pubsub/sharded.go) runs on the service's client defaults (1 s read
// timeout) and the gateway gives a subscribe SubscribeTimeout (5 s).
func TestAStalledMasterDoesNotDelaySubscribesOnTheOthers(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
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
		sctx, cancel := context.WithTimeout(ctx, subscribeBudget)
		err := sub.Subscribe(sctx, ch)
		cancel()
		d := time.Since(start)
		worst = max(worst, d)
		// The bound is the subscribe's own budget, what a socket's
		// subscribe gets, far below the failover's 15 s: a slot-map
		// reload the client starts may ask the stalled node first and
		// wait out its 1 s read timeout (twice with the retry, ≈ 2 s),
		// which a loaded machine stretches.
		if err != nil || d > subscribeBudget {
			slow++
			t.Logf("subscribe of %s on a healthy master: %v (%v)", ch, d.Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("worst subscribe latency on healthy masters during the stall: %v", worst)
	if slow > 0 {
		t.Fatalf("%d of 25 subscribes to channels of healthy masters failed or took over %v (worst %v) while another master stalled", slow, subscribeBudget, worst.Round(time.Millisecond))
	}
}

// subscribeBudget is the gateway's default SubscribeTimeout: how long a
// socket's subscribe may take before it is answered unavailable.
const subscribeBudget = 5 * time.Second

// A subscribe whose caller gives up while its master's shard connection is
// still coming up (the master stalled for a second) leaves the channel
// subscribable: the shard had queued its SSUBSCRIBE and then, on the
// give-up, its SUNSUBSCRIBE; both must not reach the master reversed,
// leaving it subscribed and the subscriber waiting forever for an
// unsubscribe confirmation before it would subscribe the channel again.
// The next socket subscribing the dialog is answered, the master carries
// no subscription nobody holds meanwhile, and a socket that subscribes
// again while the stall lasts is answered once it is over.
func TestSubscribeCancelledWhileShardConnectsStaysSubscribable(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{NodeTimeout: 15 * time.Second})
	ctx := context.Background()
	// The default canary (2 s, deadline 6 s): the 1 s stall below is no
	// dead link.
	r := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "inst-cancel"})
	testenv.Eventually(t, 10*time.Second, r.sub.Healthy, "subscriber never came up")
	victim := masterWithoutCanary(t, c, "inst-cancel")
	chs := channelsByMaster(t, c, 3)[victim.Addr()]
	ch, again, other := chs[0], chs[1], chs[2]

	thaw := victim.Freeze(t)
	for _, x := range []string{ch, again} {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := r.sub.Subscribe(sctx, x) // the gateway's SubscribeTimeout ran out
		cancel()
		if err == nil {
			t.Fatal("subscribe answered while its master was frozen")
		}
	}
	resubscribed := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resubscribed <- r.sub.Subscribe(sctx, again)
	}()
	time.Sleep(500 * time.Millisecond)
	thaw() // a 1 s stall: far below the read timeout and the canary deadline

	if err := <-resubscribed; err != nil {
		t.Fatalf("a subscribe of %s made during the stall never completes: %v", again, err)
	}
	// Another channel of that master, subscribed once the stall is over:
	// its confirmation follows whatever the shard had queued before.
	r.subscribe(t, other)
	admin := victim.AdminClient(0)
	defer admin.Close()
	for x, want := range map[string]int64{ch: 0, again: 1} {
		n, err := admin.Do(ctx, "pubsub", "shardnumsub", x).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if len(n) != 2 || n[1] != want {
			t.Fatalf("PUBSUB SHARDNUMSUB on the master = %v, want %d subscriber(s)", n, want)
		}
	}

	// The next socket subscribing the dialog.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.sub.Subscribe(sctx, ch); err != nil {
		t.Fatalf("a later subscribe of %s never completes: %v", ch, err)
	}
}
