package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// tripCounter counts what a go-redis client sends: round trips (one
// command alone, or one pipeline) and the top-level commands in them. The
// Pub/Sub connection's commands do not pass through hooks; INFO
// commandstats counts them.
type tripCounter struct{ trips, cmds atomic.Int64 }

func (w *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.trips.Add(1)
		w.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (w *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.trips.Add(1)
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

func (w *tripCounter) reset() { w.trips.Store(0); w.cmds.Store(0) }

// commandStats reads INFO commandstats: calls per command, the commands
// scripts run included (Redis counts those under their own names).
func commandStats(t testing.TB, admin *redis.Client) map[string]int64 {
	t.Helper()
	s, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(s) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// drainCost is what Redis and the client counted over one phase.
type drainCost struct {
	all, topLevel, evalsha, unsubscribe, trips int64
	byCmd                                      map[string]int64
}

// measure resets the counters, runs fn and returns what it cost. Calls
// made by the measuring itself (CONFIG RESETSTAT, INFO) are not counted.
func measure(t testing.TB, admin *redis.Client, w *tripCounter, fn func()) drainCost {
	t.Helper()
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	w.reset()
	fn()
	st := commandStats(t, admin)
	c := drainCost{byCmd: st, trips: w.trips.Load(), evalsha: st["evalsha"] + st["evalsha_ro"],
		unsubscribe: st["unsubscribe"] + st["sunsubscribe"]}
	for name, n := range st {
		if name == "config|resetstat" || name == "info" {
			continue
		}
		c.all += n
	}
	// Top level: what the client sent (hooked) plus what the Pub/Sub
	// connection sent (not hooked).
	c.topLevel = w.cmds.Load() + c.unsubscribe + st["subscribe"] + st["ssubscribe"]
	return c
}

// drainSockets is how many sockets the budget test drains:
// HAN_DRAIN_SOCKETS overrides it (the docs/benchmarks.md figure is a run
// with 10000).
func drainSockets(t testing.TB) int {
	if v := os.Getenv("HAN_DRAIN_SOCKETS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			t.Fatalf("HAN_DRAIN_SOCKETS=%q", v)
		}
		return n
	}
	return 1000
}

// rawSocket is a bare client: it reads the hello, then reads until the
// connection ends and records the close frame it got. (The harness's
// client buffers 4096 frames each: too much for thousands.)
type rawSocket struct {
	ws     *websocket.Conn
	code   websocket.StatusCode
	reason string
	done   chan struct{}
}

func dialRaw(t testing.TB, in *instance, userID string) *rawSocket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, in.wsURL(), &websocket.DialOptions{Subprotocols: []string{gateway.Subprotocol},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token(t, userID)}}})
	if err != nil {
		t.Errorf("dial: %v", err)
		return nil
	}
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"hello"`) {
		t.Errorf("hello: %s %v", b, err)
		ws.CloseNow()
		return nil
	}
	s := &rawSocket{ws: ws, code: -1, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					s.code, s.reason = ce.Code, ce.Reason
				}
				return
			}
		}
	}()
	t.Cleanup(func() { ws.CloseNow(); <-s.done })
	return s
}

// openSockets opens n sockets for users (round robin), at most 32 dialing
// at once.
func openSockets(t testing.TB, in *instance, users []string, n int) []*rawSocket {
	t.Helper()
	out := make([]*rawSocket, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range out {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = dialRaw(t, in, users[i%len(users)])
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// A drain is cheap for Redis: closing N sockets costs at most one top-level
// Redis command per connection (INFO commandstats on the instance's own
// Redis, the Pub/Sub connection's commands included) and at most one client
// round trip per 50 connections. Every socket still gets 1001 with its
// reconnect advice, and nothing of the drained connections is left in
// presence. The debounced offline checks that follow, in Close, are
// measured too: batched, one script per user.
func TestDrainRedisBudget(t *testing.T) {
	n := drainSockets(t)
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	admin := r.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	pool := openPool(t)
	// The offline checks fall due after the drain (as with the default
	// debounce, 2 s), so the two phases are measured apart; no periodic
	// heartbeat pipeline of the open sockets straddles the start of the
	// measurement (none runs once the drain started).
	in := newInstance(t, pool, opts{rtURL: r.URL(1), presence: func(c *presence.Config) {
		c.OfflineDebounce, c.RefreshInterval = 3*time.Second, time.Hour
	}})
	var w tripCounter
	in.rt.AddHook(&w)
	// Four users in five hold two sockets each.
	users := make([]string, n*5/9)
	for i := range users {
		users[i] = ids.New()
	}
	var socks []*rawSocket
	var dialer *dialerProcess
	if n > inProcessSockets {
		dialer = startDialer(t, in, users, n)
	} else {
		socks = openSockets(t, in, users, n)
	}

	drain := measure(t, admin, &w, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := in.svc.Drain(ctx); err != nil {
			t.Fatal(err)
		}
	})
	closeCost := measure(t, admin, &w, in.svc.Close)
	for _, s := range socks {
		<-s.done
		if s.code != websocket.StatusGoingAway || !strings.Contains(s.reason, `"retryMs"`) {
			t.Fatalf("socket closed with %d %q, want 1001 with retryMs", s.code, s.reason)
		}
	}
	if dialer != nil {
		if got := dialer.wait(t); got != n {
			t.Fatalf("%d of %d sockets closed with 1001 and retryMs", got, n)
		}
	}
	keys, err := admin.Keys(context.Background(), "han:rt:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "han:rt:conn:") || strings.HasPrefix(k, "han:rt:user:") || strings.HasPrefix(k, "han:rt:instance:") {
			t.Errorf("left in Redis after drain and close: %s", k)
			break
		}
	}
	t.Logf("drain of %d sockets (%d users): Redis commands %d top-level (%.3f/conn; EVALSHA %d, UNSUBSCRIBE %d), %d with the scripts' own (%.2f/conn); %d client round trips (%.1f conns/trip); by command %v",
		n, len(users), drain.topLevel, float64(drain.topLevel)/float64(n), drain.evalsha, drain.unsubscribe,
		drain.all, float64(drain.all)/float64(n), drain.trips, float64(n)/float64(max(drain.trips, 1)), drain.byCmd)
	t.Logf("close after the drain (debounced offline checks, deregistration): Redis commands %d top-level (EVALSHA %d), %d with the scripts' own; %d client round trips; by command %v",
		closeCost.topLevel, closeCost.evalsha, closeCost.all, closeCost.trips, closeCost.byCmd)
	if drain.topLevel > int64(n) {
		t.Errorf("drain of %d sockets sent %d top-level Redis commands, budget %d (one per connection)", n, drain.topLevel, n)
	}
	if drain.trips > int64(n/50) {
		t.Errorf("drain of %d sockets took %d client round trips, budget %d (one per 50 connections)", n, drain.trips, n/50)
	}
}

// inProcessSockets: more sockets than this are dialled by a child process
// (each loopback socket is two descriptors, and a process may hold 20,000).
const inProcessSockets = 5000

// dialerEnv makes the test binary a dialer (TestDrainDialer): the URL to
// dial; dialerUsers names a file of comma-separated users, dialerCount
// says how many sockets.
const (
	dialerEnv   = "HAN_DRAIN_DIALER_URL"
	dialerUsers = "HAN_DRAIN_DIALER_USERS"
	dialerCount = "HAN_DRAIN_DIALER_COUNT"
)

type dialerProcess struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

// startDialer runs this test binary as a dialer of n sockets to in and
// returns once they are all open.
func startDialer(t testing.TB, in *instance, users []string, n int) *dialerProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestDrainDialer$", "-test.v")
	usersFile := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(usersFile, []byte(strings.Join(users, ",")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), dialerEnv+"="+in.wsURL(), dialerUsers+"="+usersFile, dialerCount+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	d := &dialerProcess{cmd: cmd, out: bufio.NewScanner(stdout)}
	for d.out.Scan() {
		if d.out.Text() == "dialer: open" {
			return d
		}
	}
	t.Fatal("the dialer ended before its sockets were open")
	return nil
}

// wait returns how many sockets the dialer saw closed with 1001 and retryMs.
func (d *dialerProcess) wait(t testing.TB) int {
	t.Helper()
	for d.out.Scan() {
		if v, ok := strings.CutPrefix(d.out.Text(), "dialer: going away "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("the dialer ended without its count")
	return 0
}

// TestDrainDialer is the child process of startDialer; run on its own it
// does nothing.
func TestDrainDialer(t *testing.T) {
	u := os.Getenv(dialerEnv)
	if u == "" {
		t.Skip("the dialer of TestDrainRedisBudget")
	}
	b, err := os.ReadFile(os.Getenv(dialerUsers))
	if err != nil {
		t.Fatal(err)
	}
	users := strings.Split(string(b), ",")
	n, _ := strconv.Atoi(os.Getenv(dialerCount))
	base, _ := strings.CutSuffix(strings.TrimPrefix(u, "ws"), "/v1/realtime")
	in := &instance{t: t, srv: &httptest.Server{URL: "http" + base}}
	socks := openSockets(t, in, users, n)
	fmt.Println("dialer: open")
	good := 0
	for _, s := range socks {
		<-s.done
		if s.code == websocket.StatusGoingAway && strings.Contains(s.reason, `"retryMs"`) {
			good++
		}
	}
	fmt.Println("dialer: going away", good)
}
