package clustertest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// classicSubscribers returns how many classic and sharded subscriptions
// the whole cluster holds for channel: a classic SUBSCRIBE is held by the
// one node a subscriber is connected to, so the classic count is summed
// over every node.
func classicSubscribers(t *testing.T, c *testenv.RedisCluster, channel string) (classic, sharded int64) {
	t.Helper()
	ctx := context.Background()
	for _, n := range c.Nodes {
		a := n.AdminClient(0)
		got, err := a.PubSubNumSub(ctx, channel).Result()
		if err == nil {
			var s map[string]int64
			s, err = a.PubSubShardNumSub(ctx, channel).Result()
			sharded += s[channel]
		}
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
		classic += got[channel]
	}
	return classic, sharded
}

// With the mode forced to classic on a cluster, each instance holds one
// SUBSCRIBE connection (no SSUBSCRIBE anywhere, no per-shard links), and
// a PUBLISH through the cluster client reaches every instance on channels
// of all three masters exactly once, the canary included.
func TestClassicPubSubOnCluster(t *testing.T) {
	rdb := shared(t)
	reg := prometheus.NewRegistry()
	cfg := func(name string, reg prometheus.Registerer) pubsub.SubscriberConfig {
		return pubsub.SubscriberConfig{InstanceID: name, CanaryInterval: 200 * time.Millisecond, Registerer: reg, Mode: rds.PubSubClassic}
	}
	a := subscriberWithConfig(t, env.Cluster, cfg("classic-a", reg))
	b := subscriberWithConfig(t, env.Cluster, cfg("classic-b", nil))
	c := subscriberWithConfig(t, env.Cluster, cfg("classic-c", nil))
	byMaster := channelsByMaster(t, env.Cluster, 2)
	channels := allChannels(byMaster)
	for _, r := range []*received{a, b, c} {
		r.subscribe(t, channels...)
	}
	for _, ch := range channels {
		if n, s := classicSubscribers(t, env.Cluster, ch); n != 3 || s != 0 {
			t.Fatalf("%s: %d classic and %d sharded subscribers over the cluster, want 3 and 0", ch, n, s)
		}
	}
	publishAll(t, pubsub.NewPublisher(rdb, rds.PubSubClassic, nil, nil), channels, 1, a, b, c)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.sub.Healthy() && b.sub.Healthy() && c.sub.Healthy() },
		"the subscribers never reported healthy (canary over PUBLISH on the cluster)")
	if up, _ := shardMetrics(t, reg); len(up) != 0 {
		t.Fatalf("classic mode reported shard links %v, want none", up)
	}
	// A sharded publisher's SPUBLISH does not reach classic subscribers
	// (every instance and publisher of a deployment needs the same mode):
	// the classic frame published after it is the only new one.
	ctx := context.Background()
	if err := pubsub.NewPublisher(rdb, rds.PubSubSharded, nil, nil).Publish(ctx, channels[0], []byte("sharded")); err != nil {
		t.Fatal(err)
	}
	if err := pubsub.NewPublisher(rdb, rds.PubSubClassic, nil, nil).Publish(ctx, channels[0], []byte("classic")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.count(channels[0]) >= 2 }, "the classic frame did not arrive")
	a.mu.Lock()
	got := a.got[channels[0]]
	a.mu.Unlock()
	if len(got) != 2 || got[1] != "classic" {
		t.Fatalf("after one SPUBLISH and one PUBLISH the classic subscriber got %q, want the PUBLISH alone", got[1:])
	}
}

// Classic mode on a cluster: when the master the subscriber's one
// connection is on dies, the subscriber reconnects to the replica that
// took over and subscribes every channel again, its sockets all get
// resync, and PUBLISH reaches it again without a restart.
func TestClassicPubSubMasterDies(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	a := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "classic-a", CanaryInterval: 200 * time.Millisecond,
		ReconnectMax: time.Second, Mode: rds.PubSubClassic})
	byMaster := channelsByMaster(t, c, 1)
	channels := allChannels(byMaster)
	a.subscribe(t, channels...)
	pub := pubsub.NewPublisher(open(t, c), rds.PubSubClassic, nil, nil)
	publishAll(t, pub, channels, 1, a)
	testenv.Eventually(t, 5*time.Second, a.sub.Healthy, "the subscriber never reported healthy")

	// The connection is on the master of the canary's slot.
	victim, err := c.MasterOf(ctx, pubsub.CanaryChannel("classic-a"))
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(channels)
	slices.Sort(want)
	testenv.Eventually(t, 20*time.Second, func() bool { return slices.Equal(a.resyncedChannels(), want) },
		"after the failover not every channel was resynced")
	publishAll(t, pub, channels, 2, a)
	testenv.Eventually(t, 10*time.Second, a.sub.Healthy, "the subscriber did not become healthy again after the failover")
}
