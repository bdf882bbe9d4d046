package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// wantTooMany checks that c was refused for the per-user connection cap.
func wantTooMany(t *testing.T, c *client) {
	t.Helper()
	code, reason := c.closeStatus(10 * time.Second)
	if code != gateway.ClosePolicy || reason != "too_many_connections" {
		t.Fatalf("close %d %q, want 1008 too_many_connections", code, reason)
	}
}

// One user's sockets are capped across all instances (default 16): the
// 17th is accepted as a WebSocket and closed with 1008
// too_many_connections, by bearer token and by ticket, on either instance,
// while another user connects as usual. Closing a socket frees its slot,
// and so does the sweep of an instance that died holding some.
func TestConnectionsPerUserCappedAcrossInstances(t *testing.T) {
	// Short enough to see the sweep soon, long enough that a busy machine
	// does not let a live instance's marker lapse.
	short := func(c *presence.Config) { c.LivenessTTL, c.SweepInterval = 3*time.Second, 300*time.Millisecond }
	pool := openPool(t)
	a := newInstance(t, pool, opts{presence: short})
	b := newInstance(t, pool, opts{presence: short})
	users := a.users(2)
	u, other := users[0], users[1]
	ctx := context.Background()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	live := func() int64 { return admin.ZCard(ctx, presence.UserConnsKey(u)).Val() }

	var onA []*client
	for range 8 {
		onA = append(onA, a.connect(u))
		tk, _ := b.ticket(u)
		b.connectWith(dialOpts{ticket: tk, origin: testOrigin}).expect("hello")
	}
	if n := live(); n != 16 {
		t.Fatalf("user has %d registered connections, want 16", n)
	}

	wantTooMany(t, a.connectWith(dialOpts{token: token(t, u)}))
	tk, _ := a.ticket(u)
	wantTooMany(t, a.connectWith(dialOpts{ticket: tk, origin: testOrigin}))
	wantTooMany(t, b.connectWith(dialOpts{token: token(t, u)}))
	if n := live(); n != 16 {
		t.Fatalf("refused connections changed the registry: %d members, want 16", n)
	}
	if a.svc.Stats().Rejects["too_many_connections"] != 2 || b.svc.Stats().Rejects["too_many_connections"] != 1 {
		t.Fatalf("rejection counters: a %v, b %v", a.svc.Stats().Rejects, b.svc.Stats().Rejects)
	}
	// The cap is per user.
	a.connect(other)
	b.connect(other)

	// Closing one socket lets the next one in.
	if err := onA[0].ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return live() == 15 }, "the closed socket still holds its slot")
	b.connect(u)
	wantTooMany(t, a.connectWith(dialOpts{token: token(t, u)}))

	// b dies holding 9 of the user's sockets: after the sweep they are free.
	b.svc.Kill()
	testenv.Eventually(t, 20*time.Second, func() bool { return live() == 7 }, "the dead instance's sockets still hold their slots")
	for range 9 {
		a.connect(u)
	}
	wantTooMany(t, a.connectWith(dialOpts{token: token(t, u)}))
}

// Concurrent handshakes of one user on two instances never get more than
// the cap in: the count and the registration are one Redis script.
func TestConnectionCapHoldsUnderConcurrentHandshakes(t *testing.T) {
	pool := openPool(t)
	small := func(c *presence.Config) { c.MaxConnsPerUser = 5 }
	a := newInstance(t, pool, opts{presence: small})
	b := newInstance(t, pool, opts{presence: small})
	u := a.users(1)[0]
	const tries = 30
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		accepted, capped int
	)
	for i := range tries {
		in := a
		if i%2 == 1 {
			in = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := in.connectWith(dialOpts{token: token(t, u)})
			select {
			case f := <-c.frames:
				if f.Type == "hello" {
					mu.Lock()
					accepted++
					mu.Unlock()
				}
			case <-c.done:
				var ce websocket.CloseError
				if asCloseError(c.err, &ce) && ce.Code == gateway.ClosePolicy && ce.Reason == "too_many_connections" {
					mu.Lock()
					capped++
					mu.Unlock()
				}
			case <-time.After(10 * time.Second):
			}
		}()
	}
	wg.Wait()
	if accepted != 5 || capped != tries-5 {
		t.Fatalf("%d accepted and %d refused for the cap, want 5 and %d", accepted, capped, tries-5)
	}
}

// An instance that was only paused (a long GC, a frozen VM) comes back after
// survivors swept its connections and their user opened up to the cap
// elsewhere: its sockets over the cap are closed with 1008
// too_many_connections, as a handshake over the cap would be, and the user
// never holds more registered connections than the cap.
func TestSweptSocketsOverTheCapCloseWhenTheirInstanceComesBack(t *testing.T) {
	pool := openPool(t)
	// No periodic refresh during the test: the liveness loop's
	// re-registration after its marker lapsed is the instance coming back.
	a := newInstance(t, pool, opts{presence: func(c *presence.Config) {
		c.LivenessTTL, c.RefreshInterval = 3*time.Second, time.Hour
	}})
	b := newInstance(t, pool, opts{})
	u := a.users(1)[0]
	ctx := context.Background()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()

	var onA []*client
	for range 4 {
		onA = append(onA, a.connect(u))
	}
	// The pause: a's connections are swept (their HASHes and members go,
	// as a survivor's sweep removes them) while a still holds the sockets.
	for _, c := range onA {
		id := c.hello.ConnectionID
		if err := admin.Del(ctx, presence.ConnKey(u, id)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ZRem(ctx, presence.UserConnsKey(u), id).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 16 {
		b.connect(u)
	}
	// a comes back: its marker had expired.
	if err := admin.Del(ctx, presence.InstanceKey(a.id)).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range onA {
		wantTooMany(t, c)
	}
	if n := admin.ZCard(ctx, presence.UserConnsKey(u)).Val(); n != 16 {
		t.Fatalf("the user has %d registered connections, want the cap (16)", n)
	}
	// The 16 on b still hold the cap.
	wantTooMany(t, a.connectWith(dialOpts{token: token(t, u)}))
}
