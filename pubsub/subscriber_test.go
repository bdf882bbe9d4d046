package pubsub_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true}, &env)
}

var discard = slog.New(slog.NewJSONHandler(io.Discard, nil))

func rtClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	c, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sink records what a Subscriber delivers.
type sink struct {
	mu      sync.Mutex
	msgs    map[string][]string
	resyncs [][]string
}

func (s *sink) message(ch string, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs[ch] = append(s.msgs[ch], string(p))
}

func (s *sink) resync(chs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resyncs = append(s.resyncs, chs)
}

func (s *sink) count(ch string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs[ch])
}

func (s *sink) resyncCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.resyncs)
}

func newSubscriber(t *testing.T) (*pubsub.Subscriber, *sink) {
	t.Helper()
	k := &sink{msgs: map[string][]string{}}
	s, err := pubsub.NewSubscriber(rtClient(t), pubsub.SubscriberConfig{InstanceID: "sub-" + ids.New()[24:],
		CanaryInterval: 200 * time.Millisecond, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond},
		discard, k.message, k.resync)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Close)
	testenv.Eventually(t, 5*time.Second, s.Healthy, "subscriber never came up")
	return s, k
}

func numSub(t *testing.T, ch string) int64 {
	t.Helper()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	v, err := admin.PubSubNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return v[ch]
}

// Channels are reference counted on one connection: SUBSCRIBE on the first
// reference, UNSUBSCRIBE after the last; Subscribe returns once Redis has
// confirmed, so a publish right after it is received.
func TestSubscriberReferenceCounting(t *testing.T) {
	ctx := context.Background()
	s, k := newSubscriber(t)
	pub := rtClient(t)
	ch := pubsub.DialogChannel(ids.New())
	for i := 0; i < 2; i++ {
		if err := s.Subscribe(ctx, ch); err != nil {
			t.Fatal(err)
		}
	}
	if n := numSub(t, ch); n != 1 {
		t.Fatalf("two references must share one Redis subscription, NUMSUB=%d", n)
	}
	pub.Publish(ctx, ch, "one")
	testenv.Eventually(t, 5*time.Second, func() bool { return k.count(ch) == 1 }, "message not received")
	s.Unsubscribe(ch)
	pub.Publish(ctx, ch, "two")
	testenv.Eventually(t, 5*time.Second, func() bool { return k.count(ch) == 2 }, "one reference left: still subscribed")
	s.Unsubscribe(ch)
	testenv.Eventually(t, 5*time.Second, func() bool { return numSub(t, ch) == 0 }, "the last reference did not unsubscribe")
	s.Unsubscribe(ch) // extra releases are harmless

	// Many channels at once go out in batches and are all confirmed.
	var wg sync.WaitGroup
	chans := make([]string, 300)
	for i := range chans {
		chans[i] = pubsub.DialogChannel(ids.New())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Subscribe(ctx, chans[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if s.Channels() != 300 {
		t.Fatalf("channels: %d", s.Channels())
	}
	for _, c := range chans[:10] {
		if numSub(t, c) != 1 {
			t.Fatalf("%s not subscribed in Redis", c)
		}
	}
}

// A killed link is noticed (Receive loop, not Channel()), re-established
// with one batched resubscribe, and the channels are reported for resync.
func TestSubscriberReconnectsAndReportsResync(t *testing.T) {
	ctx := context.Background()
	s, k := newSubscriber(t)
	pub := rtClient(t)
	a, b := pubsub.DialogChannel(ids.New()), pubsub.UserChannel(ids.New())
	for _, ch := range []string{a, b} {
		if err := s.Subscribe(ctx, ch); err != nil {
			t.Fatal(err)
		}
	}
	before := k.resyncCount()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return k.resyncCount() > before }, "no resync after the link was killed")
	k.mu.Lock()
	got := fmt.Sprint(k.resyncs[len(k.resyncs)-1])
	k.mu.Unlock()
	if got != fmt.Sprint([]string{a, b}) && got != fmt.Sprint([]string{b, a}) {
		t.Fatalf("resync channels: %s", got)
	}
	pub.Publish(ctx, a, "after")
	testenv.Eventually(t, 5*time.Second, func() bool { return k.count(a) == 1 }, "no delivery after reconnect")
	testenv.Eventually(t, 5*time.Second, s.Healthy, "not healthy after reconnect")
	if s.CanaryLag() <= 0 {
		t.Fatal("the canary lag is not measured")
	}
}

// Subscribe waits for the link: while Redis is down it fails with the
// caller's deadline and keeps no reference.
func TestSubscribeWhileRedisIsDown(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	c, err := rds.NewRedis(r.URL(1), rds.RedisConfig{DialTimeout: 100 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := &sink{msgs: map[string][]string{}}
	s, err := pubsub.NewSubscriber(c, pubsub.SubscriberConfig{InstanceID: "down", CanaryInterval: 100 * time.Millisecond,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}, discard, k.message, k.resync)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	testenv.Eventually(t, 5*time.Second, s.Healthy, "subscriber never came up")
	r.Kill()
	testenv.Eventually(t, 5*time.Second, func() bool { return !s.Healthy() }, "outage not noticed")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := s.Subscribe(ctx, "han:rt:dialog:x"); err == nil {
		t.Fatal("subscribe succeeded without Redis")
	}
	if s.Channels() != 0 {
		t.Fatal("a failed subscribe kept its reference")
	}
	// One caller waits on; the others give up one after another, as first
	// sockets do during a long stall: each takes its waiter with it.
	patient := make(chan error, 1)
	go func() { patient <- s.Subscribe(context.Background(), "han:rt:dialog:y") }()
	testenv.Eventually(t, 5*time.Second, func() bool { return s.Waiters("han:rt:dialog:y") == 1 }, "the patient subscribe is not waiting")
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := s.Subscribe(ctx, "han:rt:dialog:y")
		cancel()
		if err == nil {
			t.Fatal("subscribe succeeded without Redis")
		}
	}
	if n := s.Waiters("han:rt:dialog:y"); n != 1 {
		t.Fatalf("%d waiters after five callers gave up beside one that waits, want 1", n)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, s.Healthy, "subscriber did not reconnect")
	if err := s.Subscribe(context.Background(), "han:rt:dialog:x"); err != nil {
		t.Fatal(err)
	}
	if err := <-patient; err != nil {
		t.Fatalf("the subscribe that waited through the outage: %v", err)
	}
}

// The channel count a metrics scrape reads takes no lock of the
// subscriber: scrapes walked every channel under the lock that each
// publish and subscribe takes, so a flood of them held up deliveries.
func TestChannelCountTakesNoLock(t *testing.T) {
	ctx := context.Background()
	s, _ := newSubscriber(t)
	for range 3 {
		if err := s.Subscribe(ctx, pubsub.DialogChannel(ids.New())); err != nil {
			t.Fatal(err)
		}
	}
	release := s.HoldLock()
	got := make(chan int, 1)
	go func() { got <- s.Channels() }()
	select {
	case n := <-got:
		release()
		if n != 3 {
			t.Fatalf("channels: %d, want 3", n)
		}
	case <-time.After(5 * time.Second):
		release()
		t.Fatal("the channel count waited for the subscriber's lock")
	}
}
