package clustertest_test

import (
	"context"
	"fmt"
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

// emptiedShard is a subscriber whose channel ch moved off victim in a
// manual failover: the subscriber still holds its connection to victim,
// a replica now, carrying none of its channels.
type emptiedShard struct {
	c      *testenv.RedisCluster
	a      *received
	reg    *prometheus.Registry
	victim *testenv.RedisServer
	ch     string
	pub    *pubsub.Publisher
}

// failoverEmptyingAShard runs CLUSTER FAILOVER on the replica of a master
// carrying one of the subscriber's channels (not its canary), and waits
// until the channel is confirmed on the promoted replica.
func failoverEmptyingAShard(t *testing.T) emptiedShard {
	t.Helper()
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	a := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "inst-a", CanaryInterval: 200 * time.Millisecond, Registerer: reg})
	byMaster := channelsByMaster(t, c, 1)
	victim := masterWithoutCanary(t, c, "inst-a")
	ch := byMaster[victim.Addr()][0]
	a.subscribe(t, ch)
	pub := pubsub.NewPublisher(open(t, c), rds.PubSubAuto, nil, nil)
	publishAll(t, pub, []string{ch}, 1, a)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.sub.Healthy() && linkUpGauge(t, reg) == 1 },
		"not healthy at the start")

	manualFailover(t, c, victim)
	// Generous: on a loaded machine the move waits for the slot map's
	// reload and the subscriber's retry backoff.
	var last string
	va := victim.AdminClient(0)
	defer va.Close()
	testenv.Eventually(t, 30*time.Second, func() bool {
		s, _ := shardSubscribers(t, c, ch)
		healthy, up := a.sub.Healthy(), linkUpGauge(t, reg)
		onVictim, _ := va.PubSubShardNumSub(ctx, ch).Result()
		now := fmt.Sprintf("ssubscribers on the owner=%d on the old master=%d Healthy()=%v han_pubsub_link_up=%v", s, onVictim[ch], healthy, up)
		if now != last {
			t.Logf("%s: %s", time.Now().Format("15:04:05.000"), now)
			last = now
		}
		return s == 1 && healthy && up == 1
	}, "the channel did not move to the promoted replica")
	return emptiedShard{c: c, a: a, reg: reg, victim: victim, ch: ch, pub: pub}
}

// Rolling upgrade of one shard: CLUSTER FAILOVER on the replica (the old
// master ends its subscriptions, the subscriber moves them to the promoted
// replica and resyncs them), then the old master, now a replica holding
// none of the instance's channels, is stopped for its upgrade. Nothing is
// lost and the subscriber is healthy, so han_pubsub_link_up (which the
// critical HanPubSubLinkDown alert reads) stays 1. The loss of that empty
// shard connection used to set it to 0, and nothing set it back.
func TestLinkStaysUpWhenAShardWithoutChannelsGoes(t *testing.T) {
	e := failoverEmptyingAShard(t)
	e.victim.Kill() // the old master, a replica now, stopped for its upgrade
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	publishAll(t, e.pub, []string{e.ch}, 2, e.a)
	time.Sleep(3 * time.Second)
	healthy := e.a.sub.Healthy()
	up := linkUpGauge(t, e.reg)
	upS, _ := shardMetrics(t, e.reg)
	t.Logf("Healthy()=%v han_pubsub_link_up=%v shard_link_up=%v resynced=%v", healthy, up, upS, e.a.resyncedChannels())
	if healthy && up != 1 {
		t.Fatalf("the subscriber is healthy and every channel is delivered, yet han_pubsub_link_up=%v (HanPubSubLinkDown, critical, fires after 1m)", up)
	}
}

// The same shard, emptied by a failover, then stalls instead of dying (its
// host froze): its connection stops answering PINGs until the watchdog
// ends it. Every channel is still delivered, so the subscriber stays
// healthy all along — /readyz stays ready and publishes take no local
// fallback. It used to read unhealthy from the shard's missed PONG until
// the watchdog ended that connection.
func TestHealthyWhileAShardWithoutChannelsStalls(t *testing.T) {
	e := failoverEmptyingAShard(t)
	thaw := e.victim.Freeze(t)
	defer thaw()
	deadline := time.Now().Add(2 * time.Second) // > the 600 ms PONG deadline
	for time.Now().Before(deadline) {
		if !e.a.sub.Healthy() {
			t.Fatalf("unhealthy %v after the channel-less shard froze; its channel is delivered by the promoted replica",
				(2*time.Second - time.Until(deadline)).Round(time.Millisecond))
		}
		time.Sleep(time.Millisecond)
	}
	// The publisher's slot map is older than the failover: its first
	// publish goes to the frozen node, times out, and reloads the map.
	publishUntilOK(t, e.pub, []string{e.ch}, "after-freeze")
	testenv.Eventually(t, 10*time.Second, func() bool { return e.a.count(e.ch) == 2 }, "the channel's second event never arrived")
}
