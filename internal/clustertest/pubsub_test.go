package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// received collects what one instance's subscriber delivered.
type received struct {
	mu      sync.Mutex // guards got, resyncs
	got     map[string][]string
	resyncs int
	sub     *pubsub.Subscriber
	name    string
}

func subscriber(t *testing.T, c *testenv.RedisCluster, name string) *received {
	t.Helper()
	r := &received{got: map[string][]string{}, name: name}
	sub, err := pubsub.NewSubscriber(open(t, c), pubsub.SubscriberConfig{InstanceID: name, CanaryInterval: 200 * time.Millisecond},
		slog.New(slog.DiscardHandler), func(channel string, payload []byte) {
			r.mu.Lock()
			r.got[channel] = append(r.got[channel], string(payload))
			r.mu.Unlock()
		}, func([]string) {
			r.mu.Lock()
			r.resyncs++
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

func (r *received) resynced() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resyncs
}

func (r *received) count(channel string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got[channel])
}

// On a cluster, REDIS_REALTIME_URL keeps working with classic Pub/Sub: a
// PUBLISH reaches every node of the cluster, so each instance's one
// subscriber connection, whatever node it landed on, gets the events of
// channels whose slots live on every master. (Each message then crosses
// the cluster bus to every node: this fans out correctly but does not
// spread the Pub/Sub load over the shards.)
func TestClassicPubSubFansOutAcrossMasters(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	a, b := subscriber(t, env.Cluster, "inst-a"), subscriber(t, env.Cluster, "inst-b")
	var channels []string
	masters := map[string]bool{}
	for i := range 9 {
		ch := pubsub.DialogChannel(fmt.Sprintf("00000000-0000-7000-8000-%012x", i))
		m, err := env.Cluster.MasterOf(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Addr()] = true
		channels = append(channels, ch)
		for _, r := range []*received{a, b} {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := r.sub.Subscribe(sctx, ch)
			cancel()
			if err != nil {
				t.Fatalf("%s subscribe: %v", r.name, err)
			}
		}
	}
	if len(masters) != 3 {
		t.Fatalf("the channels' slots are on %d masters, want 3", len(masters))
	}
	pub := pubsub.NewPublisher(rdb, nil, nil)
	for _, ch := range channels {
		if err := pub.Publish(ctx, ch, []byte(`{"type":"event","channel":"`+ch+`"}`)); err != nil {
			t.Fatalf("publish as api_backend: %v", err)
		}
	}
	for _, r := range []*received{a, b} {
		testenv.Eventually(t, 5*time.Second, func() bool {
			for _, ch := range channels {
				if r.count(ch) != 1 {
					return false
				}
			}
			return true
		}, "%s did not get exactly one event on each of the %d channels", r.name, len(channels))
	}
}

// When the node holding an instance's Pub/Sub connection dies, the
// subscriber reconnects to a live node, tells its sockets to resync, and
// events flow again without a restart.
func TestClassicPubSubSurvivesItsNodeDying(t *testing.T) {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	r := subscriber(t, c, "inst-f")
	ch := pubsub.DialogChannel("00000000-0000-7000-8000-00000000f001")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = r.sub.Subscribe(sctx, ch)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var holder *testenv.RedisServer
	for _, n := range c.Nodes {
		a := n.AdminClient(0)
		list, err := a.ClientList(ctx).Result()
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(list, "cmd=subscribe") {
			holder = n
		}
	}
	if holder == nil {
		t.Fatal("no node holds the subscriber's connection")
	}
	holder.Kill()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	pub := pubsub.NewPublisher(open(t, c), nil, nil)
	testenv.Eventually(t, 20*time.Second, func() bool {
		_ = pub.Publish(ctx, ch, []byte("after"))
		return r.count(ch) > 0 && r.resynced() > 0
	}, "the subscriber did not resync and receive again after its node died")
}
