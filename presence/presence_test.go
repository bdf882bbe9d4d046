package presence_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Redis: true}, &env) }

// recorder collects transitions.
type recorder struct {
	mu     sync.Mutex
	events []string // "+user" online, "-user" offline
}

func (r *recorder) Online(_ context.Context, u string, _ time.Time) {
	r.mu.Lock()
	r.events = append(r.events, "+"+u)
	r.mu.Unlock()
}

func (r *recorder) Offline(_ context.Context, u string, _ time.Time) {
	r.mu.Lock()
	r.events = append(r.events, "-"+u)
	r.mu.Unlock()
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func client(t *testing.T) redis.UniversalClient {
	t.Helper()
	c, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newPresence(t *testing.T, cfg presence.Config, ev presence.Events) *presence.Presence {
	t.Helper()
	if cfg.InstanceID == "" {
		cfg.InstanceID = "i-" + ids.New()[24:]
	}
	p, err := presence.New(client(t), cfg, ev, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestTransitionsOncePerChange(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p := newPresence(t, presence.Config{OfflineDebounce: 50 * time.Millisecond}, rec)
	u := ids.New()
	c1, c2 := presence.Conn{UserID: u, ConnID: "c1"}, presence.Conn{UserID: u, ConnID: "c2"}
	for _, c := range []presence.Conn{c1, c2} {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 1 }, "no online transition")
	if n, err := p.Online(ctx, u); err != nil || n != 2 {
		t.Fatalf("online: %d %v", n, err)
	}
	if _, err := p.Disconnect(ctx, u, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Disconnect(ctx, u, "c2"); err != nil {
		t.Fatal(err)
	}
	// A duplicate disconnect is harmless and reports nothing new.
	if _, err := p.Disconnect(ctx, u, "c2"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 2 }, "no offline transition")
	if n, _ := p.Online(ctx, u); n != 0 {
		t.Fatalf("online after disconnect: %d", n)
	}
	// The marker is gone, so a later check cannot report offline again.
	if went, err := p.MarkOffline(ctx, u); err != nil || went {
		t.Fatalf("second offline transition: %v %v", went, err)
	}
	if err := p.Connect(ctx, c1); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 3 }, "no second online transition")
	if got := rec.list(); got[0] != "+"+u || got[1] != "-"+u || got[2] != "+"+u {
		t.Fatalf("transitions: %v", got)
	}
}

// A reconnect within the debounce publishes neither offline nor online.
func TestQuickReconnectIsDebounced(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p := newPresence(t, presence.Config{OfflineDebounce: time.Hour}, rec)
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "a"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 1 }, "no online transition")
	if _, err := p.Disconnect(ctx, u, "a"); err != nil {
		t.Fatal(err)
	}
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "b"}); err != nil {
		t.Fatal(err)
	}
	// When the debounced check runs it finds a live connection.
	if went, err := p.MarkOffline(ctx, u); err != nil || went {
		t.Fatalf("offline with a live connection: %v %v", went, err)
	}
	p.Close()
	if got := rec.list(); len(got) != 1 {
		t.Fatalf("transitions: %v", got)
	}
}

// An instance that stops refreshing its liveness marker has its
// connections removed by a survivor's sweeper (per-user scripts, then its
// index), its users reported offline, and its registry entry removed.
func TestSweeperRemovesDeadInstance(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	short := presence.Config{LivenessTTL: 300 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
		OfflineDebounce: 10 * time.Millisecond, SweepBatch: 7}
	deadCfg, liveCfg := short, short
	deadCfg.InstanceID, liveCfg.InstanceID = "dead-"+ids.New()[24:], "live-"+ids.New()[24:]
	rec := &recorder{}
	dead := newPresence(t, deadCfg, nil)
	live := newPresence(t, liveCfg, rec)
	var conns []presence.Conn
	for i := 0; i < 30; i++ {
		conns = append(conns, presence.Conn{UserID: ids.New(), ConnID: ids.New()})
	}
	dead.Start(func() []presence.Conn { return conns })
	for _, c := range conns {
		if err := dead.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// The live instance has a connection of one of those users too.
	shared := presence.Conn{UserID: conns[0].UserID, ConnID: "on-live"}
	live.Start(func() []presence.Conn { return []presence.Conn{shared} })
	if err := live.Connect(ctx, shared); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rdb.ZScore(ctx, presence.InstancesKey, deadCfg.InstanceID).Err() == nil
	}, "dead instance never registered")
	dead.Close() // stops refreshing; removes nothing

	testenv.Eventually(t, 10*time.Second, func() bool {
		return rdb.Exists(ctx, presence.InstanceConnsKey(deadCfg.InstanceID)).Val() == 0 &&
			rdb.ZScore(ctx, presence.InstancesKey, deadCfg.InstanceID).Err() == redis.Nil
	}, "the dead instance was not swept")
	for _, c := range conns {
		if rdb.Exists(ctx, presence.ConnKey(c.UserID, c.ConnID)).Val() != 0 ||
			rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() != redis.Nil {
			t.Fatalf("connection %v survived the sweep", c)
		}
	}
	if n, _ := live.Online(ctx, shared.UserID); n != 1 {
		t.Fatalf("the survivor's own connection was swept: %d live", n)
	}
	// Offline for every user of the dead instance except the one still
	// connected to the survivor. (Other instances left behind by earlier
	// tests are swept too; their users are not counted.)
	mine := map[string]bool{}
	for _, c := range conns[1:] {
		mine["-"+c.UserID] = true
	}
	offline := func() int {
		n := 0
		for _, e := range rec.list() {
			if mine[e] {
				n++
			}
			if e == "-"+shared.UserID {
				t.Errorf("user %s went offline although connected to the survivor", shared.UserID)
			}
		}
		return n
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return offline() == len(conns)-1 }, "offline transitions: %v", rec.list())
}

// Pipelined scripts reload after SCRIPT FLUSH (EVALSHA in a pipeline has no
// NOSCRIPT fallback of its own).
func TestRefreshSurvivesScriptFlush(t *testing.T) {
	ctx := context.Background()
	p := newPresence(t, presence.Config{}, nil)
	c := presence.Conn{UserID: ids.New(), ConnID: "x"}
	if err := p.Refresh(ctx, []presence.Conn{c}); err != nil {
		t.Fatal(err)
	}
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Refresh(ctx, []presence.Conn{c}); err != nil {
		t.Fatalf("refresh after SCRIPT FLUSH: %v", err)
	}
	if _, err := p.Disconnect(ctx, c.UserID, c.ConnID); err != nil {
		t.Fatal(err)
	}
}

// goroutineRecorder notes the goroutine each online transition ran on.
type goroutineRecorder struct {
	mu sync.Mutex
	gs map[string]int
	n  int
}

func (r *goroutineRecorder) Online(context.Context, string, time.Time) {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b)) // "goroutine <id> [running]:"
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(f) > 1 {
		r.gs[f[1]]++
	}
	r.n++
}

func (r *goroutineRecorder) Offline(context.Context, string, time.Time) {}

func (r *goroutineRecorder) counts() (transitions, goroutines int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, len(r.gs)
}

// Transition callbacks run on goroutines that wait for the next one, so a
// connect storm's callbacks (a PostgreSQL read and a publish each) do not
// grow a fresh goroutine's stack for every user coming online.
func TestTransitionCallbacksReuseTheirGoroutine(t *testing.T) {
	ctx := context.Background()
	rec := &goroutineRecorder{gs: map[string]int{}}
	p := newPresence(t, presence.Config{}, rec)
	for i := range 20 {
		if err := p.Connect(ctx, presence.Conn{UserID: ids.New(), ConnID: "c"}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() bool { n, _ := rec.counts(); return n == i+1 }, "no online transition")
	}
	if _, gs := rec.counts(); gs > 2 {
		t.Fatalf("20 online transitions one after another ran on %d goroutines, want them on a reused one", gs)
	}
}
