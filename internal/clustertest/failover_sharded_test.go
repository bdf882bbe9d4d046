package clustertest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// replicaOf returns the node that replicates master (the harness
// attaches replica i to master i mod Masters).
func replicaOf(t *testing.T, c *testenv.RedisCluster, master *testenv.RedisServer) *testenv.RedisServer {
	t.Helper()
	for i, s := range c.Nodes[:c.Opts.Masters] {
		if s == master {
			return c.Nodes[c.Opts.Masters+i]
		}
	}
	t.Fatalf("%s is not one of the initial masters", master.Addr())
	return nil
}

func roleOf(ctx context.Context, s *testenv.RedisServer) string {
	a := s.AdminClient(0)
	defer a.Close()
	role, err := a.Do(ctx, "role").Slice()
	if err != nil || len(role) == 0 {
		return "?"
	}
	return fmt.Sprint(role[0])
}

// publishUntilOK publishes one frame on each channel, retrying a
// failed publish (an error is reported to the caller, so the event is
// not silently lost: the outbox relay retries it).
func publishUntilOK(t *testing.T, pub *pubsub.Publisher, channels []string, tag string) {
	t.Helper()
	for _, ch := range channels {
		deadline := time.Now().Add(20 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := pub.Publish(ctx, ch, []byte(`{"type":"event","channel":"`+ch+`","tag":"`+tag+`"}`))
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %s never succeeded: %v", ch, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// checkDeliveredOrResynced fails for every channel whose want-th
// event never arrived and that was never resynced either: an event lost
// silently.
func checkDeliveredOrResynced(t *testing.T, r *received, channels []string, want int) {
	t.Helper()
	ok := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ch := range channels {
			if len(r.got[ch]) < want && r.resynced[ch] == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(15 * time.Second)
	for !ok() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range channels {
		if len(r.got[ch]) < want && r.resynced[ch] == 0 {
			t.Errorf("%s: %s got %d event(s), want %d, and was never resynced: event lost silently",
				r.name, ch, len(r.got[ch]), want)
		}
	}
}

// A manual failover (CLUSTER FAILOVER on the replica: the rolling-upgrade
// procedure) demotes the master without closing any connection. The
// subscriber's channels of that master must end up on the promoted
// replica and events published after the failover must arrive (or the
// channel be resynced).
func TestAManualFailoverKeepsShardedDelivery(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	a := subscriber(t, c, "inst-a")
	byMaster, channels, pub := subscribedEverywhere(t, c, 2, a)

	victim, err := c.MasterOf(ctx, channels[0])
	if err != nil {
		t.Fatal(err)
	}
	victimChans := slices.Clone(byMaster[victim.Addr()])
	replica := manualFailover(t, c, victim)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	for _, ch := range victimChans {
		s, _ := shardSubscribers(t, c, ch)
		t.Logf("after failover: %s has %d sharded subscriber(s) on its new master %s", ch, s, replica.Addr())
	}
	t.Logf("resynced so far: %v", a.resyncedChannels())
	publishUntilOK(t, pub, channels, "after-failover")
	checkDeliveredOrResynced(t, a, channels, 2)
	// The old master (a replica now) is then taken down for its upgrade.
	victim.Kill()
	time.Sleep(2 * time.Second)
	publishUntilOK(t, pub, channels, "after-old-master-stopped")
	checkDeliveredOrResynced(t, a, channels, 3)
	for _, ch := range victimChans {
		s, _ := shardSubscribers(t, c, ch)
		t.Logf("end: %s has %d sharded subscriber(s) on its master", ch, s)
	}
}

// A master that stalls (SIGSTOP) long enough for its replica to be
// promoted, but shorter than the subscriber's PING deadline (the default
// CanaryInterval of 2 s gives 6 s), then wakes up as a replica. The events
// published on its channels while it was stalled went to the promoted
// replica; each such channel must be delivered or resynced.
func TestAMasterStalledThroughItsFailoverLosesNothingSilently(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	a := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "inst-a"}) // the service's defaults
	byMaster, channels, pub := subscribedEverywhere(t, c, 2, a)

	victim, err := c.MasterOf(ctx, channels[0])
	if err != nil {
		t.Fatal(err)
	}
	victimChans := slices.Clone(byMaster[victim.Addr()])
	replica := replicaOf(t, c, victim)
	start := time.Now()
	thaw := victim.Freeze(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return roleOf(ctx, replica) == "master" },
		"the replica was not promoted while the master stalled")
	t.Logf("replica promoted %v after the stall began", time.Since(start))
	publishUntilOK(t, pub, victimChans, "during-stall")
	t.Logf("published during the stall, %v after it began", time.Since(start))
	thaw()
	t.Logf("thawed after %v", time.Since(start))
	testenv.Eventually(t, 20*time.Second, func() bool { return roleOf(ctx, victim) == "slave" },
		"the old master did not turn into a replica")
	checkDeliveredOrResynced(t, a, victimChans, 2)
	for _, ch := range victimChans {
		s, _ := shardSubscribers(t, c, ch)
		t.Logf("%s: %d sharded subscriber(s) on the new master; resynced %v", ch, s, a.resyncedChannels())
	}
	// And the channels work again afterwards.
	publishUntilOK(t, pub, victimChans, "after-stall")
	checkDeliveredOrResynced(t, a, victimChans, 3)
	_ = strings.TrimSpace
}

// ownCluster starts a cluster of the test's own, stopped when the test
// ends, after everything the test set up on it later.
func ownCluster(t *testing.T, o testenv.ClusterOptions) *testenv.RedisCluster {
	t.Helper()
	c, err := testenv.StartCluster(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// allChannels is every channel of channelsByMaster's answer.
func allChannels(byMaster map[string][]string) []string {
	var channels []string
	for _, chs := range byMaster {
		channels = append(channels, chs...)
	}
	return channels
}

// subscribedEverywhere subscribes each of rs to perMaster channels of every
// master and publishes one event on each through the service's publisher,
// received by all of rs.
func subscribedEverywhere(t *testing.T, c *testenv.RedisCluster, perMaster int, rs ...*received) (map[string][]string, []string, *pubsub.Publisher) {
	t.Helper()
	byMaster := channelsByMaster(t, c, perMaster)
	channels := allChannels(byMaster)
	for _, r := range rs {
		r.subscribe(t, channels...)
	}
	pub := pubsub.NewPublisher(open(t, c), rds.PubSubAuto, nil, nil)
	publishAll(t, pub, channels, 1, rs...)
	return byMaster, channels, pub
}

// manualFailover runs CLUSTER FAILOVER on victim's replica (the
// rolling-upgrade step) and waits until the two swapped roles; it returns
// the promoted replica.
func manualFailover(t *testing.T, c *testenv.RedisCluster, victim *testenv.RedisServer) *testenv.RedisServer {
	t.Helper()
	ctx := context.Background()
	replica := replicaOf(t, c, victim)
	ra := replica.AdminClient(0)
	defer ra.Close()
	if err := ra.Do(ctx, "cluster", "failover").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return roleOf(ctx, replica) == "master" && roleOf(ctx, victim) == "slave"
	}, "manual failover did not complete")
	return replica
}

// masterWithoutCanary is a master that does not own the canary channel of
// instanceID: stalling or demoting it leaves the instance's liveness alone.
func masterWithoutCanary(t *testing.T, c *testenv.RedisCluster, instanceID string) *testenv.RedisServer {
	t.Helper()
	canaryMaster, err := c.MasterOf(context.Background(), pubsub.CanaryChannel(instanceID))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Nodes[:c.Opts.Masters] {
		if m != canaryMaster {
			return m
		}
	}
	t.Fatal("every master owns the canary channel")
	return nil
}
