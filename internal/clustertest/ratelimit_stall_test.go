package clustertest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store/rds"
)

// One master stalls (stopped, before any failover) after a sliding-log
// decision of its own got no reply: the limiter remembers it, to give its
// admission back once the master answers. The decisions whose keys live on
// the healthy masters are made at once, from the very next one: the
// failure does not open a breaker over the healthy masters (every
// fail-closed decision was refused for the cooldown), and they do not
// first try that refund on the stalled master (each try waited out the
// refund pass's budget there, so every decision on them paid it). Once the master wakes, the late
// admission is given back by the next decision on its master, once: every
// window then holds exactly the admissions of the decisions that allowed.
func TestRateLimitDecidesPastAStalledMaster(t *testing.T) {
	c, _ := stallCluster(t)
	ctx := context.Background()
	calls := &nodeCalls{n: map[string]int{}}
	rdb := countedClient(t, c, calls)
	reg := prometheus.NewRegistry()
	l, err := ratelimit.New(ratelimit.Config{Redis: rdb, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	const label = "POST /v1/dialogs"
	p := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed,
		Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1000, Window: time.Minute}}}
	keyOf := func(u string) string {
		return ratelimit.Key(ratelimit.FamilyUser, u, ratelimit.RouteHash(label), p.Algorithm, time.Minute)
	}
	victim := c.Nodes[0]
	users := map[string]string{} // master address → a user whose key lives on it
	for i := 0; len(users) < c.Opts.Masters; i++ {
		u := fmt.Sprintf("rl-stall-%d", i)
		m, err := c.MasterOf(ctx, keyOf(u))
		if err != nil {
			t.Fatal(err)
		}
		if users[m.Addr()] == "" {
			users[m.Addr()] = u
		}
	}
	stalled := users[victim.Addr()]
	var healthy []string
	for addr, u := range users {
		if addr != victim.Addr() {
			healthy = append(healthy, u)
		}
	}
	allowed := map[string]int64{} // user → decisions that allowed
	decide := func(u string) error {
		d, err := l.Decide(ctx, label, p, ratelimit.Subject{UserID: u})
		if err == nil && !d.Allowed {
			t.Fatalf("user %s denied under a limit of 1000", u)
		}
		if err == nil {
			allowed[u]++
		}
		return err
	}
	for _, u := range users { // load the scripts, open the connections
		if err := decide(u); err != nil {
			t.Fatal(err)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	if err := decide(stalled); err == nil {
		t.Fatal("a decision on the stalled master was made")
	}
	// The failure opens the breaker of the stalled master only.
	calls.count(true)
	var worst time.Duration
	for i := range 12 {
		start := time.Now()
		if err := decide(healthy[i%len(healthy)]); err != nil {
			t.Fatalf("decision %d on a healthy master while one stalled: %v", i+1, err)
		}
		worst = max(worst, time.Since(start))
	}
	calls.count(false)
	t.Logf("12 decisions on the healthy masters while one stalled: slowest %v", worst.Round(time.Millisecond))
	for addr := range calls.n {
		if users[addr] == "" {
			t.Fatalf("script calls counted on %s, not a master's address (masters: %v)", addr, users)
		}
	}
	if calls.n[victim.Addr()] > 0 || len(calls.n) == 0 {
		t.Fatalf("decisions on the healthy masters sent %d calls to the stalled master (calls by master: %v)",
			calls.n[victim.Addr()], calls.n)
	}

	thaw()
	stalledKey := keyOf(stalled)
	testenv.Eventually(t, 20*time.Second, func() bool {
		if decide(stalled) != nil {
			return false
		}
		n, err := rdb.ZCard(ctx, stalledKey).Result()
		return err == nil && n == allowed[stalled] && lateRefunds(t, reg) == 1
	}, "the admission of the decision that got no reply was not given back once the master woke")
	for _, u := range users {
		if n, err := rdb.ZCard(ctx, keyOf(u)).Result(); err != nil || n != allowed[u] {
			t.Errorf("user %s: the window holds %d admissions (%v), want the %d decisions that allowed", u, n, err, allowed[u])
		}
	}
}

// lateRefunds is how many admissions of decisions that got no reply the
// limiter gave back.
func lateRefunds(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "han_ratelimit_refunds_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == "unanswered" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// scriptCalls is how many of cmds run a script (the client's own calls,
// such as a slot-map reload, are not counted).
func scriptCalls(cmds ...redis.Cmder) int {
	n := 0
	for _, c := range cmds {
		if name := strings.ToLower(c.Name()); strings.HasPrefix(name, "eval") {
			n++
		}
	}
	return n
}

// nodeCalls counts, while on, the script calls a cluster client sends to each
// master, by address.
type nodeCalls struct {
	mu sync.Mutex
	on bool
	n  map[string]int
}

func (c *nodeCalls) count(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = on
}

func (c *nodeCalls) add(addr string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on && n > 0 {
		c.n[addr] += n
	}
}

// countedClient opens a cluster client of c, as the service opens it,
// whose calls to each node calls counts.
func countedClient(t *testing.T, c *testenv.RedisCluster, calls *nodeCalls) *redis.ClusterClient {
	t.Helper()
	u, err := rds.NewRedis(c.URL(), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	cc, ok := u.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("a cluster URL opened a %T", u)
	}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(callHook{addr: n.Options().Addr, calls: calls}) })
	return cc
}

type callHook struct {
	addr  string
	calls *nodeCalls
}

func (h callHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h callHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.add(h.addr, scriptCalls(cmd))
		return next(ctx, cmd)
	}
}

func (h callHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.add(h.addr, scriptCalls(cmds...))
		return next(ctx, cmds)
	}
}
