package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

func linkUpGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "han_pubsub_link_up" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("han_pubsub_link_up not exported")
	return -1
}

// Rolling upgrade of one shard: CLUSTER FAILOVER on the replica (the old
// master ends its subscriptions, the subscriber moves them to the promoted
// replica and resyncs them), then the old master, now a replica holding
// none of the instance's channels, is stopped for its upgrade. Nothing is
// lost and the subscriber is healthy, so han_pubsub_link_up (which the
// critical HanPubSubLinkDown alert reads) stays 1. The loss of that empty
// shard connection used to set it to 0, and nothing set it back.
func TestLinkStaysUpWhenAShardWithoutChannelsGoes(t *testing.T) {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	a := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "inst-a", CanaryInterval: 200 * time.Millisecond, Registerer: reg})
	byMaster := channelsByMaster(t, c, 1)
	canaryMaster, err := c.MasterOf(ctx, pubsub.CanaryChannel("inst-a"))
	if err != nil {
		t.Fatal(err)
	}
	var victim *testenv.RedisServer
	for _, m := range c.Nodes[:c.Opts.Masters] {
		if m != canaryMaster {
			victim = m
			break
		}
	}
	ch := byMaster[victim.Addr()][0]
	a.subscribe(t, ch)
	pub := pubsub.NewPublisher(open(t, c), rds.PubSubAuto, nil, nil)
	publishAll(t, pub, []string{ch}, 1, a)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.sub.Healthy() && linkUpGauge(t, reg) == 1 },
		"not healthy at the start")

	replica := replicaOf(t, c, victim)
	ra := replica.AdminClient(0)
	if err := ra.Do(ctx, "cluster", "failover").Err(); err != nil {
		t.Fatal(err)
	}
	ra.Close()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return roleOf(ctx, replica) == "master" && roleOf(ctx, victim) == "slave"
	}, "manual failover did not complete")
	// Generous: on a loaded machine the move waits for the slot map's
	// reload and the subscriber's retry backoff.
	testenv.Eventually(t, 30*time.Second, func() bool {
		s, _ := shardSubscribers(t, c, ch)
		return s == 1 && a.sub.Healthy() && linkUpGauge(t, reg) == 1
	}, "the channel did not move to the promoted replica")

	victim.Kill() // the old master, a replica now, stopped for its upgrade
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	publishAll(t, pub, []string{ch}, 2, a)
	time.Sleep(3 * time.Second)
	healthy := a.sub.Healthy()
	up := linkUpGauge(t, reg)
	upS, _ := shardMetrics(t, reg)
	t.Logf("Healthy()=%v han_pubsub_link_up=%v shard_link_up=%v resynced=%v", healthy, up, upS, a.resyncedChannels())
	if healthy && up != 1 {
		t.Fatalf("the subscriber is healthy and every channel is delivered, yet han_pubsub_link_up=%v (HanPubSubLinkDown, critical, fires after 1m)", up)
	}
}
