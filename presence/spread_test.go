package presence_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// Heartbeats are spread over the refresh interval: every connection is
// refreshed once per interval, but not all at the same instant (a burst of
// thousands of scripts would queue the Pub/Sub traffic sharing that Redis
// behind it).
func TestHeartbeatsSpreadOverTheInterval(t *testing.T) {
	ctx := context.Background()
	const interval = time.Second
	p := newPresence(t, presence.Config{RefreshInterval: interval, ConnTTL: 10 * time.Second}, nil)
	var conns []presence.Conn
	for i := range 200 {
		conns = append(conns, presence.Conn{UserID: ids.New(), ConnID: "c" + strconv.Itoa(i)})
	}
	p.Start(func() []presence.Conn { return conns })
	for _, c := range conns {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(interval * 17 / 10)
	rdb := client(t)
	now := time.Now().UnixMilli()
	lo, hi := int64(-1), int64(-1)
	for _, c := range conns {
		score, err := rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Result()
		if err != nil {
			t.Fatalf("connection %s: %v", c.ConnID, err)
		}
		s := int64(score)
		if age := now - s; age > int64(interval/time.Millisecond)*13/10+200 {
			t.Errorf("connection %s last refreshed %d ms ago, more than one interval", c.ConnID, age)
		}
		if lo < 0 || s < lo {
			lo = s
		}
		if s > hi {
			hi = s
		}
	}
	if spread := time.Duration(hi-lo) * time.Millisecond; spread < interval/2 {
		t.Fatalf("the last heartbeats of 200 connections lie within %v: refreshed in a burst, not spread over the %v interval", spread, interval)
	}
}

// Connect registers in one round trip; a connection over the per-user cap
// is refused and leaves nothing behind: no member in the user's set and no
// entry in the instance's index.
func TestConnectOverCapLeavesNoIndexEntry(t *testing.T) {
	ctx := context.Background()
	p := newPresence(t, presence.Config{MaxConnsPerUser: 2}, nil)
	u := ids.New()
	for _, id := range []string{"a", "b"} {
		if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c"}); !errors.Is(err, presence.ErrTooManyConnections) {
		t.Fatalf("third connection: %v, want ErrTooManyConnections", err)
	}
	rdb := client(t)
	members, err := rdb.ZRange(ctx, presence.InstanceConnsKey(p.Config().InstanceID), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{u + ":a", u + ":b"}; !slices.Equal(members, want) {
		t.Fatalf("instance index = %v, want %v", members, want)
	}
	if n, _ := rdb.ZCard(ctx, presence.UserConnsKey(u)).Result(); n != 2 {
		t.Fatalf("user's connections = %d, want 2", n)
	}
}

// wire counts what the client sends: round trips (a command alone or a
// pipeline) and top-level commands.
type wire struct {
	trips, cmds atomic.Int64
	// hold: how many of the next pipelines wait holdFor before they go
	// out (a slow round trip, during which the other calls queue).
	hold    atomic.Int64
	holdFor time.Duration
}

func (w *wire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *wire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.trips.Add(1)
		w.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (w *wire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.trips.Add(1)
		if w.hold.Add(-1) >= 0 {
			time.Sleep(w.holdFor)
		}
		for _, c := range cmds {
			switch c.Name() {
			case "hello", "auth", "client", "select": // a new pool connection's set-up
			default:
				w.cmds.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A storm of connects and a drain of disconnects share pipelines: at most
// one round trip per 50 connections, and one command per connection (its
// own script) plus one index command per round trip.
func TestConnectStormAndDrainAreBatched(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	var w wire
	rdb.AddHook(&w)
	p, err := presence.New(rdb, presence.Config{InstanceID: "i-" + ids.New()[24:]}, nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const n = 1000
	conns := make([]presence.Conn, n)
	for i := range conns {
		conns[i] = presence.Conn{UserID: ids.New(), ConnID: "c" + strconv.Itoa(i)}
	}
	all := func(fn func(c presence.Conn) error) {
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for _, c := range conns {
			wg.Go(func() {
				<-start
				if err := fn(c); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	// Load the scripts first (a first use also sends SCRIPT LOAD).
	warm := presence.Conn{UserID: ids.New(), ConnID: "warm"}
	if err := p.Connect(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Disconnect(ctx, warm.UserID, warm.ConnID); err != nil {
		t.Fatal(err)
	}
	for _, phase := range []struct {
		name string
		fn   func(c presence.Conn) error
	}{
		{"connect", func(c presence.Conn) error { return p.Connect(ctx, c) }},
		{"disconnect", func(c presence.Conn) error { _, err := p.Disconnect(ctx, c.UserID, c.ConnID); return err }},
	} {
		w.trips.Store(0)
		w.cmds.Store(0)
		// The first pipelines (lone calls, sent at once) take 200 ms, as a
		// round trip under load would: every other call arrives while they
		// are in flight, whatever the scheduler's pace, and must queue and
		// share the next pipelines.
		w.holdFor = 200 * time.Millisecond
		w.hold.Store(2)
		all(phase.fn)
		w.hold.Store(0)
		trips, cmds := w.trips.Load(), w.cmds.Load()
		t.Logf("%s of %d connections: %d round trips, %d commands", phase.name, n, trips, cmds)
		if trips > n/50 {
			t.Errorf("%s: %d round trips for %d connections, want ≤ 1 per 50", phase.name, trips, n)
		}
		if cmds > n+trips {
			t.Errorf("%s: %d commands for %d connections in %d round trips, want ≤ one per connection + one per round trip", phase.name, cmds, n, trips)
		}
	}
	// The users' offline checks are listed there until they have run.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return rdb.ZCard(ctx, presence.InstanceConnsKey(p.Config().InstanceID)).Val() == 0
	}, "instance index still holds entries after every disconnect and check")
}

// With a linger, a connect that finds a pipeline free waits for others:
// those that arrive within it share its round trip, and each connection is
// registered.
func TestConnectsWithinTheLingerShareOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	p, err := presence.New(rdb, presence.Config{InstanceID: "i-" + ids.New()[24:], Linger: 300 * time.Millisecond}, nil,
		slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// Load the scripts first (a first use also sends SCRIPT LOAD).
	warm := presence.Conn{UserID: ids.New(), ConnID: "warm"}
	if err := p.Connect(ctx, warm); err != nil {
		t.Fatal(err)
	}
	var w wire
	rdb.AddHook(&w)
	conns := make([]presence.Conn, 4)
	for i := range conns {
		conns[i] = presence.Conn{UserID: ids.New(), ConnID: "c" + strconv.Itoa(i)}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			if err := p.Connect(ctx, c); err != nil {
				t.Error(err)
			}
		})
		if i == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg.Wait()
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("the first connect returned after %v, before its linger ended", waited)
	}
	if trips := w.trips.Load(); trips != 1 {
		t.Fatalf("four connects within the linger took %d round trips, want one", trips)
	}
	for _, c := range conns {
		if n, err := rdb.Exists(ctx, presence.ConnKey(c.UserID, c.ConnID)).Result(); err != nil || n != 1 {
			t.Fatalf("connection %s not registered: %d %v", c.ConnID, n, err)
		}
	}
}

// Connects that share a pipeline answer each for its own script: one
// user's broken key (a value of the wrong type) fails that user's connect
// only, and a disconnect beside it still removes its connection. The
// batch's shared index update is what a connect or disconnect also
// depends on, and it succeeded.
func TestOneFailingRegistrationDoesNotFailItsPipeline(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	p, err := presence.New(rdb, presence.Config{InstanceID: "i-" + ids.New()[24:], Linger: 200 * time.Millisecond}, nil,
		slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	leaving := presence.Conn{UserID: ids.New(), ConnID: "leaving"}
	if err := p.Connect(ctx, leaving); err != nil {
		t.Fatal(err)
	}
	broken := presence.Conn{UserID: ids.New(), ConnID: "broken"}
	if err := rdb.Set(ctx, presence.UserConnsKey(broken.UserID), "not a set", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	conns := []presence.Conn{broken}
	for i := range 3 {
		conns = append(conns, presence.Conn{UserID: ids.New(), ConnID: "c" + strconv.Itoa(i)})
	}
	errs := make([]error, len(conns))
	var disconnectErr error
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { errs[i] = p.Connect(ctx, c) })
	}
	wg.Go(func() { _, disconnectErr = p.Disconnect(ctx, leaving.UserID, leaving.ConnID) })
	wg.Wait()
	if errs[0] == nil {
		t.Fatal("the connect of the user whose key is broken succeeded")
	}
	for i, c := range conns[1:] {
		if errs[i+1] != nil {
			t.Errorf("connect %s failed with another user's error: %v", c.ConnID, errs[i+1])
		} else if n := rdb.Exists(ctx, presence.ConnKey(c.UserID, c.ConnID)).Val(); n != 1 {
			t.Errorf("connection %s not registered", c.ConnID)
		}
	}
	if disconnectErr != nil {
		t.Errorf("a disconnect in the same pipeline failed with another user's error: %v", disconnectErr)
	}
	if n, _ := p.Online(ctx, leaving.UserID); n != 0 {
		t.Errorf("the disconnected connection is still live")
	}
}
