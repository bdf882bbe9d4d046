package pubsub_test

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// Network partition and reconnect backoff: the instance's Pub/Sub
// link goes through a fault proxy. While Redis cannot be reached the
// subscriber retries with a growing backoff (not a hot loop); once the
// partition heals it resubscribes every channel, reports the resync, and
// messages flow again.
func TestPubSubReconnectBackoffAcrossPartition(t *testing.T) {
	p, err := faultproxy.Start(env.Redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A client of its own (no idle pool) so the proxy sees only the link's dials.
	link := redis.NewClient(&redis.Options{Addr: p.Addr(), Username: rds.APIBackendUser, Password: env.Redis.Password,
		DB: 1, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer link.Close()
	pub, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var mu sync.Mutex
	var got []string
	var resyncs [][]string
	s, err := pubsub.NewSubscriber(link, pubsub.SubscriberConfig{InstanceID: "i-" + ids.New()[24:],
		CanaryInterval: 100 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 2 * time.Second}, discard,
		func(_ string, b []byte) { mu.Lock(); got = append(got, string(b)); mu.Unlock() },
		func(chs []string) { mu.Lock(); resyncs = append(resyncs, chs); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	ctx := context.Background()
	ch := pubsub.DialogChannel(ids.New())
	if err := s.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	pub.Publish(ctx, ch, "before")
	testenv.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 }, "no message before the partition")

	p.Refuse(true)
	p.Cut()
	before := len(p.Dials())
	testenv.Eventually(t, 20*time.Second, func() bool { return len(p.Dials())-before >= 6 }, "the link did not retry")
	testenv.Eventually(t, 5*time.Second, func() bool { return !s.Healthy() }, "the link still reports healthy during the partition")
	d := p.Dials()[before:]
	gaps := make([]time.Duration, 0, len(d)-1)
	for i := 1; i < len(d); i++ {
		gaps = append(gaps, d[i].Sub(d[i-1]))
	}
	// Full jitter in [b/2, b] with b doubling from ReconnectMin: the fifth
	// wait is at least 8× ReconnectMin, the first at most ReconnectMin.
	if !(gaps[4] > gaps[0]) {
		t.Fatalf("reconnect attempts do not back off: gaps %v", gaps)
	}
	sorted := append([]time.Duration(nil), gaps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	if sorted[0] < 10*time.Millisecond {
		t.Fatalf("a reconnect came sooner than ReconnectMin/2: gaps %v", gaps)
	}

	p.Refuse(false)
	testenv.Eventually(t, 10*time.Second, s.Healthy, "the link did not recover after the partition")
	mu.Lock()
	n := len(resyncs)
	var last []string
	if n > 0 {
		last = resyncs[n-1]
	}
	mu.Unlock()
	if n == 0 || !strings.Contains(strings.Join(last, ","), ch) {
		t.Fatalf("no resync reported for %s after the partition: %v", ch, last)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		pub.Publish(ctx, ch, "after")
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2 && got[len(got)-1] == "after"
	}, "messages do not flow after the partition healed")
}
