package pubsub_test

import (
	"bytes"
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// proxiedLink is a Pub/Sub link client on DB 1 whose connections go
// through a fault proxy; both are closed when the test ends. The client is
// its own (no idle pool), so the proxy sees only the link's dials.
func proxiedLink(t *testing.T) (*faultproxy.Proxy, *redis.Client) {
	t.Helper()
	p, err := faultproxy.Start(env.Redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	link := redis.NewClient(&redis.Options{Addr: p.Addr(), Username: rds.APIBackendUser, Password: env.Redis.Password,
		DB: 1, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = link.Close() })
	return p, link
}

// Network partition and reconnect backoff: the instance's Pub/Sub
// link goes through a fault proxy. While Redis cannot be reached the
// subscriber retries with a growing backoff (not a hot loop); once the
// partition heals it resubscribes every channel, reports the resync, and
// messages flow again.
func TestPubSubReconnectBackoffAcrossPartition(t *testing.T) {
	p, link := proxiedLink(t)
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

// silentOnSubscribe is a connection that goes silent (a half-open TCP
// link: writes vanish, reads never return until it is closed) at its
// SUBSCRIBE, while armed is positive; its handshake (HELLO/AUTH/SELECT)
// was answered normally. subs counts the SUBSCRIBEs written.
type silentOnSubscribe struct {
	net.Conn
	armed, subs *atomic.Int64
	dead        atomic.Bool
	once        sync.Once
	closed      chan struct{}
}

func (c *silentOnSubscribe) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.subs.Add(1)
		if c.armed.Add(-1) >= 0 {
			c.dead.Store(true)
		}
	}
	if c.dead.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *silentOnSubscribe) Read(b []byte) (int, error) {
	if c.dead.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if c.dead.Load() { // went silent while this read waited
		<-c.closed
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *silentOnSubscribe) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A link that goes silent after its handshake, before Redis confirmed its
// initial SUBSCRIBE batch, is ended and tried again like one that goes
// silent later: the instance would otherwise get no cross-instance event
// until the kernel gave up on the socket, minutes later.
func TestPubSubLinkSilentBeforeItsSubscriptionsAreConfirmedIsReconnected(t *testing.T) {
	var armed, subs atomic.Int64
	link := redis.NewClient(&redis.Options{Addr: env.Redis.Addr(), Username: rds.APIBackendUser, Password: env.Redis.Password,
		DB: 1, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &silentOnSubscribe{Conn: c, armed: &armed, subs: &subs, closed: make(chan struct{})}, nil
		}})
	defer link.Close()
	s, err := pubsub.NewSubscriber(link, pubsub.SubscriberConfig{InstanceID: "i-" + ids.New()[24:],
		CanaryInterval: 100 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}, discard,
		func(string, []byte) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	if err := s.Subscribe(context.Background(), pubsub.DialogChannel(ids.New())); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, s.Healthy, "never healthy")

	// Redis drops the link (restart, failover); the next connection's
	// SUBSCRIBE goes unanswered. Two are armed: go-redis's own reconnect
	// of the dying PubSub, and the subscriber's next session.
	armed.Store(2)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.ClientKillByFilter(context.Background(), "USER", rds.APIBackendUser, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return armed.Load() <= 0 }, "the link did not reconnect")
	start := subs.Load()
	// CanaryDeadline is 300 ms: the silent session is ended long before.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !s.Healthy() {
		time.Sleep(50 * time.Millisecond)
	}
	if !s.Healthy() {
		t.Fatalf("the link is still down 5 s after the reconnect, %d new SUBSCRIBEs tried: a session whose initial SUBSCRIBE is never answered waits forever", subs.Load()-start)
	}
}

// slowReads hands a reader at most 32 bytes at a time, 2 ms apart, while
// slow is set: a live link that is slow to deliver.
type slowReads struct {
	net.Conn
	slow *atomic.Bool
}

func (c *slowReads) Read(b []byte) (int, error) {
	if c.slow.Load() {
		time.Sleep(2 * time.Millisecond)
		b = b[:min(len(b), 32)]
	}
	return c.Conn.Read(b)
}

// A link that is slow but alive is not taken for a silent one while its
// initial SUBSCRIBE batch is confirmed, even when reading all of the
// confirmations takes many times CanaryDeadline: the confirmations keep
// coming (a canary published meanwhile arrives only after them all).
func TestPubSubSlowInitialConfirmationIsNotTakenForASilentLink(t *testing.T) {
	var slow atomic.Bool
	link := redis.NewClient(&redis.Options{Addr: env.Redis.Addr(), Username: rds.APIBackendUser, Password: env.Redis.Password,
		DB: 1, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &slowReads{Conn: c, slow: &slow}, nil
		}})
	defer link.Close()
	s, err := pubsub.NewSubscriber(link, pubsub.SubscriberConfig{InstanceID: "i-" + ids.New()[24:],
		CanaryInterval: 100 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}, discard,
		func(string, []byte) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	// 600 confirmations of about 85 bytes: some 1,600 slow reads, seconds
	// against a CanaryDeadline of 300 ms.
	ctx := context.Background()
	for range 600 {
		if err := s.Subscribe(ctx, pubsub.DialogChannel(ids.New())); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, s.Healthy, "never healthy")

	slow.Store(true)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.ClientKillByFilter(ctx, "USER", rds.APIBackendUser, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !s.Healthy() }, "the link did not notice the kill")
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, s.Healthy, "the slow link never came up: its sessions were ended while Redis was still confirming")
	t.Logf("up again after %v", time.Since(start).Round(time.Millisecond))
}
