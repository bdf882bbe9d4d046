package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// received collects what one instance's subscriber delivered.
type received struct {
	mu       sync.Mutex // guards got, resynced
	got      map[string][]string
	resynced map[string]int
	sub      *pubsub.Subscriber
	name     string
}

func subscriber(t *testing.T, c *testenv.RedisCluster, name string) *received {
	t.Helper()
	return subscriberWithMetrics(t, c, name, nil)
}

func subscriberWithMetrics(t *testing.T, c *testenv.RedisCluster, name string, reg prometheus.Registerer) *received {
	t.Helper()
	return subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: name, CanaryInterval: 200 * time.Millisecond, Registerer: reg})
}

// subscriberWithConfig starts a subscriber of cfg (cfg.InstanceID names
// it) on its own client of c.
func subscriberWithConfig(t *testing.T, c *testenv.RedisCluster, cfg pubsub.SubscriberConfig) *received {
	t.Helper()
	name := cfg.InstanceID
	r := &received{got: map[string][]string{}, resynced: map[string]int{}, name: name}
	sub, err := pubsub.NewSubscriber(open(t, c), cfg,
		slog.New(slog.DiscardHandler), func(channel string, payload []byte) {
			r.mu.Lock()
			r.got[channel] = append(r.got[channel], string(payload))
			r.mu.Unlock()
		}, func(channels []string) {
			r.mu.Lock()
			for _, ch := range channels {
				r.resynced[ch]++
			}
			r.mu.Unlock()
		})
	if err != nil {
		t.Fatal(err)
	}
	sub.Start()
	t.Cleanup(sub.Close)
	r.sub = sub
	return r
}

// resyncedChannels returns the channels OnResync named, sorted.
func (r *received) resyncedChannels() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.resynced))
	for ch := range r.resynced {
		out = append(out, ch)
	}
	slices.Sort(out)
	return out
}

func (r *received) count(channel string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got[channel])
}

func (r *received) subscribe(t *testing.T, channels ...string) {
	t.Helper()
	for _, ch := range channels {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.sub.Subscribe(ctx, ch)
		cancel()
		if err != nil {
			t.Fatalf("%s subscribe %s: %v", r.name, ch, err)
		}
	}
}

// channelsByMaster returns perMaster dialog channels for each master of c,
// keyed by the master's address.
func channelsByMaster(t *testing.T, c *testenv.RedisCluster, perMaster int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	for i := 0; len(out) < 3 || !full(out, perMaster); i++ {
		if i > 1000 {
			t.Fatal("could not place channels on 3 masters")
		}
		ch := pubsub.DialogChannel(fmt.Sprintf("00000000-0000-7000-8000-%012x", i))
		m, err := c.MasterOf(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		if len(out[m.Addr()]) < perMaster {
			out[m.Addr()] = append(out[m.Addr()], ch)
		}
	}
	return out
}

func full(m map[string][]string, n int) bool {
	for _, v := range m {
		if len(v) < n {
			return false
		}
	}
	return true
}

// shardSubscribers returns how many sharded and classic subscriptions
// the master of channel holds for it.
func shardSubscribers(t *testing.T, c *testenv.RedisCluster, channel string) (sharded, classic int64) {
	t.Helper()
	ctx := context.Background()
	m, err := c.MasterOf(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	a := m.AdminClient(0)
	defer a.Close()
	s, err := a.PubSubShardNumSub(ctx, channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := a.PubSubNumSub(ctx, channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return s[channel], n[channel]
}

// publishAll publishes one frame per channel through the service's
// publisher and waits until every instance got exactly want frames on
// each.
func publishAll(t *testing.T, pub *pubsub.Publisher, channels []string, want int, rs ...*received) {
	t.Helper()
	ctx := context.Background()
	for _, ch := range channels {
		if err := pub.Publish(ctx, ch, []byte(`{"type":"event","channel":"`+ch+`"}`)); err != nil {
			t.Fatalf("publish as api_backend: %v", err)
		}
	}
	for _, r := range rs {
		testenv.Eventually(t, 10*time.Second, func() bool {
			for _, ch := range channels {
				if r.count(ch) != want {
					return false
				}
			}
			return true
		}, "%s did not get %d event(s) on each of the %d channels", r.name, want, len(channels))
	}
}

// On a cluster the fan-out is sharded: each of three instances
// SSUBSCRIBEs a channel on the master owning its slot (no classic
// subscription anywhere), and the publisher's SPUBLISH reaches every
// instance on channels of all three masters, exactly once.
func TestShardedPubSubAcrossMasters(t *testing.T) {
	rdb := shared(t)
	reg := prometheus.NewRegistry()
	a, b, c := subscriberWithMetrics(t, env.Cluster, "inst-a", reg), subscriber(t, env.Cluster, "inst-b"), subscriber(t, env.Cluster, "inst-c")
	byMaster := channelsByMaster(t, env.Cluster, 3)
	channels := allChannels(byMaster)
	for _, r := range []*received{a, b, c} {
		r.subscribe(t, channels...)
	}
	for _, ch := range channels {
		if s, n := shardSubscribers(t, env.Cluster, ch); s != 3 || n != 0 {
			t.Fatalf("%s on its master: %d sharded and %d classic subscribers, want 3 and 0", ch, s, n)
		}
	}
	publishAll(t, pubsub.NewPublisher(rdb, rds.PubSubAuto, nil, nil), channels, 1, a, b, c)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.sub.Healthy() && b.sub.Healthy() && c.sub.Healthy() },
		"the subscribers never reported healthy (canary over SPUBLISH)")
	// One connection per master, each carrying that master's channels.
	up, perShard := shardMetrics(t, reg)
	for addr, chs := range byMaster {
		if up[addr] != 1 || perShard[addr] != len(chs) {
			t.Errorf("shard %s: link up %v, %d channels; want 1 and %d", addr, up[addr], perShard[addr], len(chs))
		}
	}
	if len(up) != 3 {
		t.Errorf("%d shards reported, want 3: %v", len(up), up)
	}
	// The last reference gone, the channel is released on its shard.
	a.sub.Unsubscribe(channels[0])
	testenv.Eventually(t, 5*time.Second, func() bool {
		s, _ := shardSubscribers(t, env.Cluster, channels[0])
		return s == 2
	}, "SUNSUBSCRIBE did not reach the channel's master")
	if got := a.resyncedChannels(); len(got) != 0 {
		t.Fatalf("nothing failed, yet these channels were resynced: %v", got)
	}
	// The shard's channel count follows: one less on channels[0]'s master
	// (held again, one more), whatever the scrape races with.
	owner := ""
	for addr, chs := range byMaster {
		if slices.Contains(chs, channels[0]) {
			owner = addr
		}
	}
	if _, perShard := shardMetrics(t, reg); perShard[owner] != len(byMaster[owner])-1 {
		t.Errorf("shard %s after an unsubscribe: %d channels, want %d", owner, perShard[owner], len(byMaster[owner])-1)
	}
	a.subscribe(t, channels[0])
	if _, perShard := shardMetrics(t, reg); perShard[owner] != len(byMaster[owner]) {
		t.Errorf("shard %s subscribed again: %d channels, want %d", owner, perShard[owner], len(byMaster[owner]))
	}
}

// Kill one master: its replica takes over, the subscriber moves exactly
// that master's channels to it and resyncs them; the channels of the other
// masters are never resynced; events flow on all channels again without a
// restart.
func TestShardedPubSubMasterDies(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	a, b := subscriberWithMetrics(t, c, "inst-a", reg), subscriber(t, c, "inst-b")
	byMaster, channels, pub := subscribedEverywhere(t, c, 2, a, b)

	victim, err := c.MasterOf(ctx, channels[0])
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(byMaster[victim.Addr()])
	slices.Sort(want)
	victim.Kill()
	// While the replica has not taken over, the dead master's shard is
	// reported down.
	testenv.Eventually(t, 10*time.Second, func() bool {
		up, _ := shardMetrics(t, reg)
		v, ok := up[victim.Addr()]
		return ok && v == 0
	}, "the dead master's shard was not reported down")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*received{a, b} {
		testenv.Eventually(t, 20*time.Second, func() bool { return len(r.resyncedChannels()) >= len(want) },
			"%s: the dead master's channels were not resynced", r.name)
		if got := r.resyncedChannels(); !slices.Equal(got, want) {
			t.Fatalf("%s resynced %v, want exactly the dead master's channels %v", r.name, got, want)
		}
		r.mu.Lock()
		for _, ch := range want {
			if n := r.resynced[ch]; n != 1 {
				t.Errorf("%s: %s resynced %d times, want once", r.name, ch, n)
			}
		}
		r.mu.Unlock()
	}
	publishAll(t, pub, channels, 2, a, b)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.sub.Healthy() && b.sub.Healthy() },
		"the subscribers did not become healthy again after the failover")
	// Once its channels are on the promoted replica, three live shards
	// again and the dead address is gone.
	up, perShard := shardMetrics(t, reg)
	if _, ok := up[victim.Addr()]; ok || len(up) != 3 {
		t.Fatalf("shards after the failover: %v, want 3 live ones without %s", up, victim.Addr())
	}
	total := 0
	for addr, v := range up {
		if v != 1 {
			t.Errorf("shard %s link up %v after the failover", addr, v)
		}
		total += perShard[addr]
	}
	if total != len(channels) {
		t.Errorf("%d channels over the shards after the failover, want %d", total, len(channels))
	}
	// After a failover every per-shard family has a series, the reconnect
	// counter included: each one the alerts and the dashboard read exists.
	assertShardFamiliesExported(t, reg)
}

// Move the slot of one channel to another master: the server drops the
// channel's subscriptions (SUNSUBSCRIBE), the subscriber resubscribes that
// slot's channel on the new owner and resyncs it alone.
func TestShardedPubSubSlotMove(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{})
	ctx := context.Background()
	a := subscriber(t, c, "inst-a")
	_, channels, pub := subscribedEverywhere(t, c, 2, a)

	moved := channels[0]
	from, err := c.MasterOf(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := masters[0]
	if to == from {
		to = masters[1]
	}
	moveSlot(t, ctx, c, testenv.Slot(moved), from, to)
	testenv.Eventually(t, 20*time.Second, func() bool { return len(a.resyncedChannels()) > 0 },
		"the moved slot's channel was not resynced")
	if got := a.resyncedChannels(); !slices.Equal(got, []string{moved}) {
		t.Fatalf("resynced %v, want only the moved slot's channel %s", got, moved)
	}
	if s, _ := shardSubscribers(t, c, moved); s != 1 {
		t.Fatalf("the new owner holds %d sharded subscriptions of the moved channel, want 1", s)
	}
	publishAll(t, pub, channels, 2, a)
}

// shardMetrics reads han_pubsub_shard_link_up and han_pubsub_shard_channels
// by shard address. The canary's channel is not counted.
func shardMetrics(t *testing.T, reg *prometheus.Registry) (up map[string]float64, channels map[string]int) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	up, channels = map[string]float64{}, map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			shard := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "shard" {
					shard = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "han_pubsub_shard_link_up":
				up[shard] = m.GetGauge().GetValue()
			case "han_pubsub_shard_channels":
				channels[shard] = int(m.GetGauge().GetValue())
			}
		}
	}
	return up, channels
}
