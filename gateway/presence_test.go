package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

type liveConn struct {
	user, id string
	c        *client
}

// 1,000 concurrent connections on one instance: each has its HASH and ZSET
// member with TTLs; closing half removes theirs (a second disconnect is
// harmless); the instance stopped without cleanup has the rest removed by
// the other instance's sweeper within liveness TTL + sweep interval.
//
// The connects get the handshake's own budget for their DB1 calls: on a
// loaded two-core machine under -race a registration took longer than the
// harness's 500 ms, and its refusal (1013, as during an outage) is not what
// this test checks.
func TestThousandConnectionsPresenceAndSweep(t *testing.T) {
	const liveness, sweep = time.Second, 300 * time.Millisecond
	short := func(c *presence.Config) { c.LivenessTTL, c.SweepInterval = liveness, sweep }
	pool := openPool(t)
	a := newInstance(t, pool, opts{presence: short, rtBudget: 5 * time.Second})
	b := newInstance(t, pool, opts{presence: short, rtBudget: 5 * time.Second})
	users := a.users(250)
	ctx := context.Background()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()

	conns := make([]liveConn, 1000)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 100)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			u := users[i%len(users)]
			c := a.connect(u)
			conns[i] = liveConn{user: u, id: c.hello.ConnectionID, c: c}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// The server writes hello before it adds the connection to its count.
	testenv.Eventually(t, 10*time.Second, func() bool { return a.svc.Stats().Connections == 1000 },
		"the instance never held the 1000 connections")

	type state struct{ hashTTL, memberScore, zsetTTL, indexed int }
	check := func(cs []liveConn) []state {
		pipe := admin.Pipeline()
		var cmds []redis.Cmder
		for _, c := range cs {
			cmds = append(cmds,
				pipe.PTTL(ctx, presence.ConnKey(c.user, c.id)),
				pipe.ZScore(ctx, presence.UserConnsKey(c.user), c.id),
				pipe.PTTL(ctx, presence.UserConnsKey(c.user)),
				pipe.ZScore(ctx, presence.InstanceConnsKey(a.id), c.user+":"+c.id))
		}
		_, _ = pipe.Exec(ctx)
		out := make([]state, len(cs))
		for i := range cs {
			ttl := func(c redis.Cmder) int {
				if d := c.(*redis.DurationCmd).Val(); d > 0 {
					return 1
				}
				return 0
			}
			score := func(c redis.Cmder) int {
				if c.Err() == nil {
					return 1
				}
				return 0
			}
			out[i] = state{ttl(cmds[4*i]), score(cmds[4*i+1]), ttl(cmds[4*i+2]), score(cmds[4*i+3])}
		}
		return out
	}
	for i, s := range check(conns) {
		if s != (state{1, 1, 1, 1}) {
			t.Fatalf("connection %d: HASH TTL / ZSET member / ZSET TTL / index = %+v", i, s)
		}
	}
	h := admin.HGetAll(ctx, presence.ConnKey(conns[0].user, conns[0].id)).Val()
	if h["user_id"] != conns[0].user || h["instance"] != a.id || h["last_seen"] == "" {
		t.Fatalf("connection HASH: %v", h)
	}

	// Close half: their keys go, the other half stays.
	closed, open := conns[:500], conns[500:]
	for _, c := range closed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.c.ws.Close(websocket.StatusNormalClosure, "")
		}()
	}
	wg.Wait()
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, s := range check(closed) {
			if s.hashTTL+s.memberScore+s.indexed != 0 {
				return false
			}
		}
		return true
	}, "closed connections still in Redis")
	// A second disconnect is harmless: nothing of the open half changes.
	p, err := presence.New(a.rt, presence.Config{InstanceID: a.id}, nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range closed[:50] {
		if _, err := p.Disconnect(ctx, c.user, c.id); err != nil {
			t.Fatalf("second disconnect: %v", err)
		}
	}
	p.Close()
	for i, s := range check(open) {
		if s != (state{1, 1, 1, 1}) {
			t.Fatalf("open connection %d lost its keys: %+v", i, s)
		}
	}

	// Instance a dies without cleanup; b's sweeper removes the rest.
	a.svc.Kill()
	killed := time.Now()
	for i, s := range check(open[:10]) {
		if s != (state{1, 1, 1, 1}) {
			t.Fatalf("a crash must not clean up (connection %d: %+v)", i, s)
		}
	}
	bound := liveness + sweep
	testenv.Eventually(t, bound+10*time.Second, func() bool {
		for _, s := range check(open) {
			if s.hashTTL+s.memberScore+s.indexed != 0 {
				return false
			}
		}
		return true
	}, "the sweeper did not remove the dead instance's connections")
	took := time.Since(killed)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return admin.ZScore(ctx, presence.InstancesKey, a.id).Err() == redis.Nil
	}, "the dead instance is still registered")
	for _, u := range users[:20] {
		if n, _ := admin.Exists(ctx, presence.UserConnsKey(u)).Result(); n != 0 {
			t.Fatalf("user %s still has a connection ZSET", u)
		}
	}
	t.Logf("swept %d connections %v after the kill (bound %v + polling)", len(open), took.Round(10*time.Millisecond), bound)
	_ = b
}
