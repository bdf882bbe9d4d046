package pubsub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// busyScript keeps Redis's event loop busy for ARGV[1] microseconds: the
// subscriber's socket gets nothing meanwhile, as during a stall.
const busyScript = `local s=redis.call('TIME'); local st=s[1]*1000000+s[2]
while true do local n=redis.call('TIME'); if n[1]*1000000+n[2]-st > tonumber(ARGV[1]) then break end end
return 1`

func stallSetup(t *testing.T, interval, deadline time.Duration) (*testenv.RedisServer, *pubsub.Subscriber, *sink, *redis.Client, string) {
	t.Helper()
	r, c := testenv.StallableRedis(t, 1, time.Second)
	s, k := startSink(t, c, pubsub.SubscriberConfig{CanaryInterval: interval, CanaryDeadline: deadline, MaxMessageBytes: 16 << 20}, 5*time.Second)
	ch := pubsub.DialogChannel(ids.New())
	if err := s.Subscribe(context.Background(), ch); err != nil {
		t.Fatal(err)
	}
	return r, s, k, adminPublisher(t, r, 10*time.Second), ch
}

// startSink starts a subscriber on c with cfg (a fresh instance id, fast
// reconnects and, unless cfg sets one, a 200 ms canary) delivering to a
// new sink, and waits up to up for it to be healthy.
func startSink(t *testing.T, c redis.UniversalClient, cfg pubsub.SubscriberConfig, up time.Duration) (*pubsub.Subscriber, *sink) {
	t.Helper()
	cfg.InstanceID = "ps-" + ids.New()[24:]
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 100*time.Millisecond
	if cfg.CanaryInterval == 0 {
		cfg.CanaryInterval = 200 * time.Millisecond
	}
	k := &sink{msgs: map[string][]string{}}
	s, err := pubsub.NewSubscriber(c, cfg, discard, k.message, k.resync)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Close)
	testenv.Eventually(t, up, s.Healthy, "subscriber never came up")
	return s, k
}

// adminPublisher is a client of r's DB1 as its admin, with read and write
// timeouts long enough for large messages.
func adminPublisher(t *testing.T, r *testenv.RedisServer, timeout time.Duration) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(r.AdminURL(1))
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout, opt.WriteTimeout = timeout, timeout
	pub := redis.NewClient(opt)
	t.Cleanup(func() { pub.Close() })
	return pub
}

// A Redis that pauses while it writes a message to the instance's link
// (Redis writes a large reply over several turns of its event loop; a
// fork, a swapping host or a long script stalls it between two) must not
// cost that message: the link is still alive (the canary deadline has not
// passed), so the message arrives whole when Redis goes on. A read
// deadline that passed in the middle of the message used to leave its
// rest to be parsed as the next reply: the message was lost and no resync
// told the sockets.
func TestAMessageRedisPausedInTheMiddleOfArrivesWhole(t *testing.T) {
	_, _, k, pub, ch := stallSetup(t, 300*time.Millisecond, 10*time.Second)
	ctx := context.Background()
	busy := redis.NewClient(pub.Options())
	t.Cleanup(func() { busy.Close() })
	if err := busy.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, ch, strings.Repeat("+", 8<<20)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := busy.Eval(ctx, busyScript, nil, 1500000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, ch, "after").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		m := k.msgs[ch]
		return len(m) > 0 && m[len(m)-1] == "after"
	}, "the message after the stall never arrived")
	time.Sleep(500 * time.Millisecond)
	k.mu.Lock()
	defer k.mu.Unlock()
	if got := len(k.msgs[ch]); got != 2 || len(k.resyncs) != 0 {
		t.Fatalf("the subscriber delivered %d of 2 messages and reported %d resyncs: a pause shorter than the canary deadline must cost nothing", got, len(k.resyncs))
	}
	if len(k.msgs[ch][0]) != 8<<20 {
		t.Fatalf("the large message arrived with %d bytes", len(k.msgs[ch][0]))
	}
}
