package pubsub_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// A message far larger than any event, published on a channel the
// instance subscribed (a broken or hostile publisher), is not held in the
// instance's memory: it is dropped while it is read, the channel's
// sockets are told to resync (they missed a message), and the link stays
// up and delivers what follows, an invalid JSON text included (the
// subscriber forwards bytes, it does not parse them). Redis's own output
// buffer limit for Pub/Sub clients, which would cut the link first, is off
// here: the instance must not depend on it.
func TestOversizedMessageIsDroppedWhileRead(t *testing.T) {
	ctx := context.Background()
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	admin := r.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	if err := admin.ConfigSet(ctx, "client-output-buffer-limit", "pubsub 0 0 0").Err(); err != nil {
		t.Fatal(err)
	}
	c, err := rds.NewRedis(r.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, k := startSink(t, c, pubsub.SubscriberConfig{}, 5*time.Second)
	ch := pubsub.DialogChannel(ids.New())
	if err := s.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	pub := adminPublisher(t, r, 30*time.Second)

	const size = 64 << 20
	big := bytes.Repeat([]byte{'x'}, size)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, p := range []any{"first", big, "{not json", "last"} {
		if err := pub.Publish(ctx, ch, p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		m := k.msgs[ch]
		return len(m) > 0 && m[len(m)-1] == "last"
	}, "the messages after the large one never arrived")
	runtime.ReadMemStats(&after)
	k.mu.Lock()
	got, resyncs := append([]string(nil), k.msgs[ch]...), append([][]string(nil), k.resyncs...)
	k.mu.Unlock()
	for _, m := range got {
		if len(m) > 1<<20 {
			t.Fatalf("a message of %d bytes reached the sockets", len(m))
		}
	}
	if len(got) != 3 || got[0] != "first" || got[1] != "{not json" {
		t.Fatalf("delivered %q, want first, {not json, last", got)
	}
	if len(resyncs) != 1 || len(resyncs[0]) != 1 || resyncs[0][0] != ch {
		t.Fatalf("resyncs %v: the channel that lost a message must be resynced, once", resyncs)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > size/4 {
		t.Fatalf("receiving the large message allocated %d MiB", grew>>20)
	}
	if !s.Healthy() {
		t.Fatal("the link is not healthy after the large message")
	}
}

// The limit follows the stream's framing wherever the reads split it:
// messages of many sizes around the limit, published back to back, arrive
// byte for byte and in order when they fit, and each one over the limit
// (by a single byte too) costs exactly one resync of its channel.
func TestMessagesAroundTheLimitArriveExactly(t *testing.T) {
	ctx := context.Background()
	const limit = 20000
	s, k := startSink(t, rtClient(t), pubsub.SubscriberConfig{MaxMessageBytes: limit}, 5*time.Second)
	ch := pubsub.DialogChannel(ids.New())
	if err := s.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	pub := rtClient(t)
	var want []string
	over := 0
	sizes := []int{1, limit, limit + 1, limit - 1, 9, 10, 99, 100, 32 << 10, 3 * limit}
	for i := 0; i < 600; i++ {
		n := sizes[i%len(sizes)] + (i*7919)%5
		p := bytes.Repeat([]byte{byte('a' + i%26)}, n)
		copy(p, fmt.Sprintf("%d:", i))
		if n > limit {
			over++
		} else {
			want = append(want, string(p))
		}
		if err := pub.Publish(ctx, ch, p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return k.count(ch) >= len(want) && k.resyncCount() >= over },
		"delivered %d of %d, %d of %d resyncs", k.count(ch), len(want), k.resyncCount(), over)
	time.Sleep(200 * time.Millisecond)
	k.mu.Lock()
	defer k.mu.Unlock()
	if got := k.msgs[ch]; len(got) != len(want) || len(k.resyncs) != over {
		t.Fatalf("delivered %d messages and %d resyncs, want %d and %d", len(got), len(k.resyncs), len(want), over)
	}
	for i, m := range k.msgs[ch] {
		if m != want[i] {
			t.Fatalf("message %d arrived altered: %d bytes, want %d", i, len(m), len(want[i]))
		}
	}
	for _, r := range k.resyncs {
		if len(r) != 1 || r[0] != ch {
			t.Fatalf("resync %v", r)
		}
	}
}

// On a Redis Cluster every master's shard connection drops an oversized
// message the same way: only the channel that lost it is resynced, and the
// shard keeps delivering.
func TestOversizedShardMessageIsDropped(t *testing.T) {
	ctx := context.Background()
	c, err := testenv.StartCluster(testenv.ClusterOptions{Replicas: -1, NodeTimeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	for _, n := range c.Nodes {
		a := n.AdminClient(0)
		err := a.ConfigSet(ctx, "client-output-buffer-limit", "pubsub 0 0 0").Err()
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	rdb, err := rds.NewRedis(c.URL(), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	s, k := startSink(t, rdb, pubsub.SubscriberConfig{}, 10*time.Second)
	// Channels until every master holds one.
	masters := map[string]string{}
	var chans []string
	for len(masters) < len(c.Nodes) {
		ch := pubsub.DialogChannel(ids.New())
		m, err := c.MasterOf(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		if masters[m.Addr()] == "" {
			masters[m.Addr()] = ch
			chans = append(chans, ch)
			if err := s.Subscribe(ctx, ch); err != nil {
				t.Fatal(err)
			}
		}
	}
	big := bytes.Repeat([]byte{'x'}, 4<<20)
	for _, ch := range chans {
		for _, p := range []any{big, "after"} {
			if err := rdb.SPublish(ctx, ch, p).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, ch := range chans {
			if k.count(ch) == 0 {
				return false
			}
		}
		return k.resyncCount() >= len(chans)
	}, "the message after each large one, or the resync of its channel, never came")
	time.Sleep(200 * time.Millisecond)
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ch := range chans {
		if m := k.msgs[ch]; len(m) != 1 || m[0] != "after" {
			t.Fatalf("channel %s delivered %d messages (the first of %d bytes), want only after", ch, len(m), len(m[0]))
		}
	}
	if len(k.resyncs) != len(chans) {
		t.Fatalf("resyncs %v, want one per channel", k.resyncs)
	}
}
