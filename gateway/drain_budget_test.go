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
	"slices"
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
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
)

// tripCounter counts what a go-redis client sends: round trips (one
// command alone, or one pipeline) and the top-level commands in them, by
// name (a script call by the script's name). The Pub/Sub connection's
// commands do not pass through hooks; INFO commandstats counts them.
type tripCounter struct {
	trips    atomic.Int64
	ownTrips atomic.Int64 // trips that carry a command other than background
	mu       sync.Mutex
	cmds     map[string]int64
}

var scriptNames = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	for _, s := range lua.All() {
		m[s.Hash()] = s.Name
	}
	return m
})

// count records c under its name and reports whether it is one of the
// background commands.
func (w *tripCounter) count(c redis.Cmder) bool {
	name := c.Name()
	switch name {
	case "hello", "auth", "client", "select": // a new pool connection's set-up
		return true
	case "evalsha", "evalsha_ro":
		if sha, ok := c.Args()[1].(string); ok && scriptNames()[sha] != "" {
			name = scriptNames()[sha]
		}
	case "publish", "spublish":
		if ch, ok := c.Args()[1].(string); ok && strings.HasPrefix(ch, "han:rt:canary:") {
			name = "canary"
		}
	case "del":
		// An offline check that found the user gone deletes its record
		// next: part of the check, whose time is the debounce's, not the
		// drain's.
		if k, ok := c.Args()[1].(string); ok && strings.HasPrefix(k, "han:rt:user:{") && strings.HasSuffix(k, "}:offline") {
			name = "offline_record"
		}
	case "zrange", "exists":
		if k, ok := c.Args()[1].(string); ok && (k == presence.InstancesKey || strings.HasPrefix(k, "han:rt:instance:{")) {
			name = "sweep"
		}
	}
	w.mu.Lock()
	w.cmds[name]++
	w.mu.Unlock()
	return slices.Contains(background, name)
}

func (w *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.trips.Add(1)
		if !w.count(cmd) {
			w.ownTrips.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (w *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.trips.Add(1)
		own := false
		for _, c := range cmds {
			own = !w.count(c) || own
		}
		if own {
			w.ownTrips.Add(1)
		}
		return next(ctx, cmds)
	}
}

func (w *tripCounter) reset() {
	w.trips.Store(0)
	w.ownTrips.Store(0)
	w.mu.Lock()
	w.cmds = map[string]int64{}
	w.mu.Unlock()
}

// background are the commands an instance sends whether or not it drains:
// its liveness refresh (every LivenessTTL/3), its sweeper's look for dead
// instances and its Pub/Sub canary; and the debounced offline checks that
// follow a disconnect (one script per user left with no connection, then
// the deletion of the check's record), counted apart. On a loaded machine
// the drain can outlast the debounce, so the first users' checks may run
// while the drain is still being measured.
var background = []string{"rt_instance_heartbeat", "rt_instances_add", "sweep", "canary", "rt_offline", "offline_record"}

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
	all      int64 // INFO commandstats: every command, the scripts' own included
	topLevel int64 // what the instance sent: its client's commands and its Pub/Sub connection's
	own      int64 // topLevel less the background (liveness, sweeper, canary, offline checks)
	trips    int64 // client round trips
	ownTrips int64 // trips less those of background commands only
	sent     map[string]int64
	byCmd    map[string]int64
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
	c := drainCost{byCmd: st, trips: w.trips.Load(), ownTrips: w.ownTrips.Load(), sent: map[string]int64{}}
	for name, n := range st {
		if name != "config|resetstat" && name != "info" {
			c.all += n
		}
	}
	w.mu.Lock()
	for name, n := range w.cmds {
		c.sent[name] = n
		c.topLevel += n
	}
	w.mu.Unlock()
	for _, name := range []string{"subscribe", "unsubscribe", "ssubscribe", "sunsubscribe"} {
		if st[name] > 0 {
			c.sent[name] = st[name]
			c.topLevel += st[name]
		}
	}
	c.own = c.topLevel
	for _, name := range background {
		c.own -= c.sent[name]
	}
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

// A drain is cheap for Redis: closing N sockets costs at most one Redis
// command per connection (what the instance sends, its Pub/Sub connection
// included, less its liveness refresh, sweeper and canary, which run
// anyway, and the debounced offline checks, reported apart) and at
// most one client round trip per 50 connections (round trips of those
// background commands alone not counted). Every socket still gets
// 1001 with its reconnect advice, and nothing of the drained connections is
// left in Redis. The debounced offline checks that follow, in Close, are
// measured too: one script per user, batched. Both with one socket per
// user and with most users holding two.
func TestDrainRedisBudget(t *testing.T) {
	n := drainSockets(t)
	for _, tc := range []struct {
		name  string
		users int
	}{{"one socket per user", n}, {"four users in five with two sockets", n * 5 / 9}} {
		t.Run(tc.name, func(t *testing.T) { drainBudget(t, n, tc.users) })
	}
}

func drainBudget(t *testing.T, n, nUsers int) {
	r, admin := privateRedis(t)
	// The offline checks mostly fall due after the drain (as with the
	// default debounce, 2 s), so the two phases are measured apart (those
	// that fall due sooner count as background); no periodic
	// heartbeat pipeline of the open sockets straddles the start of the
	// measurement (none runs once the drain started).
	in := newInstance(t, openPool(t), opts{rtURL: r.URL(1), presence: func(c *presence.Config) {
		c.OfflineDebounce, c.RefreshInterval = time.Second+time.Duration(n)*400*time.Microsecond, time.Hour
	}})
	w := &tripCounter{cmds: map[string]int64{}}
	in.rt.AddHook(w)
	users := make([]string, nUsers)
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
	var took time.Duration
	relinks := pubsubReconnects(t, in)
	drain := measure(t, admin, w, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		start := time.Now()
		if err := in.svc.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		took = time.Since(start)
	})
	if relinks = pubsubReconnects(t, in) - relinks; relinks > 0 {
		// The Pub/Sub link was found silent for its canary deadline (a
		// starved test machine) and came back: it subscribed its channels
		// again, as it does whatever the instance is doing. That is the
		// link's recovery, not the drain's cost.
		for _, name := range []string{"subscribe", "ssubscribe"} {
			drain.own -= drain.sent[name]
		}
		t.Logf("the Pub/Sub link reconnected %v times during the drain; its subscribes are not counted", relinks)
	}
	var closeTook time.Duration
	closeCost := measure(t, admin, w, func() {
		start := time.Now()
		in.svc.Close()
		closeTook = time.Since(start)
	})
	t.Logf("drain of %d sockets (%d users) in %v: %d commands sent (%.3f/conn), %d less background (%.3f/conn); %d with the scripts' own (%.2f/conn); %d client round trips (%.0f conns/trip), %d less background; sent %v; commandstats %v",
		n, nUsers, took.Round(time.Millisecond), drain.topLevel, float64(drain.topLevel)/float64(n), drain.own, float64(drain.own)/float64(n),
		drain.all, float64(drain.all)/float64(n), drain.trips, float64(n)/float64(max(drain.trips, 1)), drain.ownTrips, drain.sent, drain.byCmd)
	t.Logf("close after the drain (debounced offline checks, deregistration) in %v: %d commands sent, %d less background; %d with the scripts' own; %d client round trips; sent %v; commandstats %v",
		closeTook.Round(time.Millisecond), closeCost.topLevel, closeCost.own, closeCost.all, closeCost.trips, closeCost.sent, closeCost.byCmd)
	checkDrained(t, admin, socks, dialer, n)
	if drain.own > int64(n) {
		t.Errorf("drain of %d sockets sent %d Redis commands, budget %d (one per connection)", n, drain.own, n)
	}
	if drain.ownTrips > int64(n/50) {
		t.Errorf("drain of %d sockets took %d client round trips less background, budget %d (one per 50 connections)", n, drain.ownTrips, n/50)
	}
}

// pubsubReconnects reads han_pubsub_reconnects_total: how many times the
// instance's Pub/Sub link came back after it was lost.
func pubsubReconnects(t *testing.T, in *instance) float64 {
	t.Helper()
	mfs, err := in.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "han_pubsub_reconnects_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no han_pubsub_reconnects_total")
	return 0
}

// checkDrained fails unless every socket was closed with 1001 and retryMs
// and no connection, user or instance key is left in Redis.
func checkDrained(t *testing.T, admin *redis.Client, socks []*rawSocket, dialer *dialerProcess, n int) {
	t.Helper()
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
		if strings.HasPrefix(k, "han:rt:conn:") && strings.HasSuffix(k, ":closed") {
			// A closed socket's marker, which keeps a heartbeat already on
			// its way from registering the connection again, lives for the
			// connection TTL and no longer.
			if ttl := admin.PTTL(context.Background(), k).Val(); ttl <= 0 || ttl > 90*time.Second {
				t.Fatalf("closed marker %s has TTL %v, want (0, 90s]", k, ttl)
			}
			continue
		}
		if strings.HasPrefix(k, "han:rt:conn:") || strings.HasPrefix(k, "han:rt:user:") || strings.HasPrefix(k, "han:rt:instance:") {
			t.Fatalf("left in Redis after drain and close: %s", k)
		}
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
