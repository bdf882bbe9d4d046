package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Redis: true}, &env) }

var algorithms = []ratelimit.Algorithm{ratelimit.SlidingLog, ratelimit.FixedWindow, ratelimit.TokenBucket}

var scripts = map[ratelimit.Algorithm]*lua.Script{
	ratelimit.SlidingLog:  lua.RateLimitSliding,
	ratelimit.FixedWindow: lua.RateLimitFixed,
	ratelimit.TokenBucket: lua.RateLimitBucket,
}

// client connects to the package's redis-server as api_backend (DB0).
func client(t testing.TB, r *testenv.RedisServer) redis.UniversalClient {
	t.Helper()
	c, err := rds.NewRedis(r.URL(0), rds.RedisConfig{PoolSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func admin(t testing.TB, r *testenv.RedisServer) *redis.Client {
	t.Helper()
	c := r.AdminClient(0)
	t.Cleanup(func() { c.Close() })
	return c
}

func userKey(a ratelimit.Algorithm, w time.Duration) string {
	return ratelimit.Key(ratelimit.FamilyUser, ids.New(), ratelimit.RouteHash("GET /test"), a, w)
}

func eval(t *testing.T, c redis.Scripter, a ratelimit.Algorithm, keys []string, rules ...ratelimit.Rule) ratelimit.Decision {
	t.Helper()
	d, err := ratelimit.Eval(context.Background(), c, a, ids.New(), keys, rules)
	if err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	return d
}

func user(limit int, w time.Duration) ratelimit.Rule {
	return ratelimit.Rule{Family: ratelimit.FamilyUser, Limit: limit, Window: w}
}

// 200 concurrent calls of each script against a limit of 50 admit exactly
// 50, and the admitted ones see every remaining count from 49 down to 0 once.
func TestScriptsAdmitExactlyTheLimitUnderConcurrency(t *testing.T) {
	c := client(t, env.Redis)
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			key := userKey(a, time.Hour)
			var wg sync.WaitGroup
			var mu sync.Mutex
			remaining := map[int64]int{}
			errs := make(chan error, 200)
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := scripts[a].Run(context.Background(), c, []string{key}, fmt.Sprintf("req-%d", i), 50, 3600000, 0).Int64Slice()
					if err != nil {
						errs <- err
						return
					}
					if v[0] == 1 {
						mu.Lock()
						remaining[v[1]]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if len(remaining) != 50 {
				t.Fatalf("admitted %d distinct remaining values, want exactly 50 admissions: %v", len(remaining), remaining)
			}
			for r := int64(0); r < 50; r++ {
				if remaining[r] != 1 {
					t.Fatalf("remaining %d seen %d times, want once", r, remaining[r])
				}
			}
		})
	}
}

// After a denial with reset_at_ms R, every later decision is allowed exactly
// when its now_ms >= R: checked by polling short windows until admitted.
func TestRetryAfterIsExact(t *testing.T) {
	c := client(t, env.Redis)
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			// A round proves something only if it saw a denial before the
			// reset; on a loaded machine the first look after the denial
			// can come after it (a bucket's reset is 100 ms away), so a
			// round that saw none is run again on a new key.
			for round := 0; retryAfterRound(t, c, a) == 0; round++ {
				if round == 4 {
					t.Fatal("no denial observed before the reset in five rounds: the test proved nothing")
				}
			}
		})
	}
}

// retryAfterRound exhausts a fresh key, then asks until it is admitted
// again: every denial before the first denial's reset_at, and no admission
// before it. It returns how many denials it saw between the two.
func retryAfterRound(t *testing.T, c redis.Scripter, a ratelimit.Algorithm) (denied int) {
	t.Helper()
	rule := user(3, 300*time.Millisecond)
	key := []string{userKey(a, rule.Window)}
	var denial ratelimit.Decision
	for i := 0; ; i++ {
		d := eval(t, c, a, key, rule)
		if !d.Allowed {
			denial = d
			break
		}
		if i == 10 {
			t.Fatal("never denied")
		}
	}
	if denial.RetryAfterMs <= 0 || denial.RetryAfterMs != denial.ResetAtMs-denial.NowMs {
		t.Fatalf("denial: retry_after_ms %d, reset_at %d, now %d", denial.RetryAfterMs, denial.ResetAtMs, denial.NowMs)
	}
	if denial.Families[0].ResetAtMs != denial.ResetAtMs || denial.Remaining != 0 {
		t.Fatalf("denial: %+v", denial)
	}
	check := func() ratelimit.Decision {
		d := eval(t, c, a, key, rule)
		if d.Allowed != (d.NowMs >= denial.ResetAtMs) {
			t.Fatalf("allowed=%v at now %d, reset_at of the denial %d", d.Allowed, d.NowMs, denial.ResetAtMs)
		}
		if !d.Allowed {
			denied++
			if d.ResetAtMs != denial.ResetAtMs {
				t.Fatalf("a later denial moved reset_at from %d to %d", denial.ResetAtMs, d.ResetAtMs)
			}
		}
		return d
	}
	// Poll until 20 ms before the reset, then ask back to back so that the
	// decisions around the boundary millisecond are seen.
	testenv.Eventually(t, 5*time.Second, func() bool {
		d := check()
		return d.Allowed || d.NowMs >= denial.ResetAtMs-20
	}, "reset_at never approached")
	for i := 0; ; i++ {
		if check().Allowed {
			break
		}
		if i == 100000 {
			t.Fatal("never admitted again")
		}
	}
	return denied
}

func TestRetryAfterSecondsIsTheCeiling(t *testing.T) {
	c := client(t, env.Redis)
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			rule := user(1, 2500*time.Millisecond)
			key := []string{userKey(a, rule.Window)}
			if d := eval(t, c, a, key, rule); !d.Allowed {
				t.Fatal("first request denied")
			}
			d := eval(t, c, a, key, rule)
			if d.Allowed {
				t.Fatal("second request admitted")
			}
			ms := d.ResetAtMs - d.NowMs
			want := int((ms + 999) / 1000)
			if got := d.RetryAfterSeconds(); got != want || want < 2 || want > 3 {
				t.Fatalf("Retry-After %d s for %d ms, want %d", got, ms, want)
			}
		})
	}
}

type snapshot struct {
	dump     string
	expireAt time.Duration
}

func snap(t *testing.T, a *redis.Client, key string) snapshot {
	t.Helper()
	ctx := context.Background()
	dump, err := a.Dump(ctx, key).Result()
	if err != nil {
		t.Fatalf("dump %s: %v", key, err)
	}
	return snapshot{dump, a.PExpireTime(ctx, key).Val()}
}

// A denial leaves the key byte for byte as it was, expiry included.
func TestDenialWritesNothing(t *testing.T) {
	c, ad := client(t, env.Redis), admin(t, env.Redis)
	ctx := context.Background()
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			rule := user(2, time.Minute)
			key := userKey(a, rule.Window)
			eval(t, c, a, []string{key}, rule)
			eval(t, c, a, []string{key}, rule)
			before := snap(t, ad, key)
			for range 3 {
				if d := eval(t, c, a, []string{key}, rule); d.Allowed {
					t.Fatal("third request admitted")
				}
			}
			if after := snap(t, ad, key); after != before {
				t.Fatalf("denials changed the key: %+v → %+v", before, after)
			}
			switch a {
			case ratelimit.SlidingLog:
				if n := ad.ZCard(ctx, key).Val(); n != 2 {
					t.Fatalf("ZCARD %d, want 2", n)
				}
			case ratelimit.FixedWindow:
				if v := ad.Get(ctx, key).Val(); v != "2" {
					t.Fatalf("counter %q, want 2", v)
				}
			}
		})
	}
}

// Every key a script writes carries a TTL of at most window + jitter.
func TestKeysCarryWindowPlusJitter(t *testing.T) {
	c, ad := client(t, env.Redis), admin(t, env.Redis)
	for _, a := range algorithms {
		rule := user(5, 20*time.Second)
		key := userKey(a, rule.Window)
		eval(t, c, a, []string{key}, rule)
		ttl := ad.PTTL(context.Background(), key).Val()
		max := rule.Window + time.Duration(ratelimit.Jitter(key, rule.Window))*time.Millisecond
		if ttl <= 0 || ttl > max || ttl < rule.Window-time.Second {
			t.Fatalf("%s: PTTL %v, want about window %v + jitter (≤ %v)", a, ttl, rule.Window, max)
		}
	}
}

// A fixed-window counter found in its jitter tail (window over, key not yet
// expired) starts a new window instead of counting on.
func TestFixedWindowRestartsInTheJitterTail(t *testing.T) {
	c, ad := client(t, env.Redis), admin(t, env.Redis)
	ctx := context.Background()
	rule := user(1, 10*time.Second)
	// Jitter is a function of the key: take a key with a tail of at least
	// 200 ms (most keys of a 10 s window have up to 1 s).
	var key string
	var j int64
	for j < 200 {
		key = userKey(ratelimit.FixedWindow, rule.Window)
		j = ratelimit.Jitter(key, rule.Window)
	}
	// A full counter whose window ended 1 ms ago, still alive for j-1 ms.
	now := time.Now().UnixMilli()
	ad.Set(ctx, key, "1", 0)
	ad.PExpireAt(ctx, key, time.UnixMilli(now-1+j))
	d := eval(t, c, ratelimit.FixedWindow, []string{key}, rule)
	if !d.Allowed || d.ResetAtMs != d.NowMs+rule.Window.Milliseconds() {
		t.Fatalf("tail counter not restarted: %+v", d)
	}
	if v := ad.Get(ctx, key).Val(); v != "1" {
		t.Fatalf("counter %q after restart, want 1", v)
	}
}

func newLimiter(t *testing.T, c redis.Scripter, routes map[string]ratelimit.Policy, mod func(*ratelimit.Config)) (*ratelimit.Limiter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := ratelimit.Config{Redis: c, Policies: ratelimit.Static{Set: ratelimit.MustPolicySet("test", routes, ratelimit.Policy{})},
		Registerer: reg, Timeout: 500 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	l, err := ratelimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, reg
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

const sendRoute = "POST /v1/dialogs/{id}/messages"

func sendPolicy(a ratelimit.Algorithm) ratelimit.Policy {
	return ratelimit.Policy{Algorithm: a, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{
		user(5, time.Hour),
		{Family: ratelimit.FamilyIP, Limit: 5, Window: time.Hour},
		{Family: ratelimit.FamilyDialog, Limit: 1, Window: time.Hour},
	}}
}

// user + ip + dialog in one script: a denial by the dialog debits neither the
// user's nor the ip's counter.
func TestMultiFamilyDenialDebitsNone(t *testing.T) {
	c, ad := client(t, env.Redis), admin(t, env.Redis)
	ctx := context.Background()
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			p := sendPolicy(a)
			l, _ := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, func(c *ratelimit.Config) { c.Mode = ratelimit.ModeAtomic })
			dialog := ids.New()
			alice := ratelimit.Subject{UserID: ids.New(), IPHMAC: "aaaa", DialogID: dialog}
			bob := ratelimit.Subject{UserID: ids.New(), IPHMAC: "bbbb" + string(a), DialogID: ids.New()}
			rh := ratelimit.RouteHash(sendRoute)
			bobUser := ratelimit.Key(ratelimit.FamilyUser, bob.UserID, rh, a, time.Hour)
			bobIP := ratelimit.Key(ratelimit.FamilyIP, bob.IPHMAC, rh, a, time.Hour)
			// Bob sends once elsewhere, so his user and ip keys exist.
			if d, err := l.Decide(ctx, sendRoute, p, bob); err != nil || !d.Allowed || len(d.Families) != 3 {
				t.Fatalf("bob's first send: %+v %v", d, err)
			}
			userBefore, ipBefore := snap(t, ad, bobUser), snap(t, ad, bobIP)
			if d, err := l.Decide(ctx, sendRoute, p, alice); err != nil || !d.Allowed {
				t.Fatalf("alice: %+v %v", d, err)
			}
			bob.DialogID = dialog
			d, err := l.Decide(ctx, sendRoute, p, bob)
			if err != nil || d.Allowed {
				t.Fatalf("bob into alice's full dialog: %+v %v", d, err)
			}
			if d.Families[0].Remaining != 4 || d.Families[2].Remaining != 0 {
				t.Fatalf("families after the denial: %+v", d.Families)
			}
			if snap(t, ad, bobUser) != userBefore || snap(t, ad, bobIP) != ipBefore {
				t.Fatal("the dialog's denial debited bob's user or ip counter")
			}
		})
	}
}

// Per-family mode (keys in different Cluster slots): the user family admits,
// the dialog family denies, and the user's admission is refunded.
func TestPerFamilyModeRefundsEarlierAdmissions(t *testing.T) {
	c, ad := client(t, env.Redis), admin(t, env.Redis)
	ctx := context.Background()
	for _, a := range algorithms {
		t.Run(string(a), func(t *testing.T) {
			p := sendPolicy(a)
			p.Rules = []ratelimit.Rule{p.Rules[0], p.Rules[2]} // user first, then dialog
			l, reg := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, func(c *ratelimit.Config) { c.Mode = ratelimit.ModePerFamily })
			full := ids.New()
			if d, _ := l.Decide(ctx, sendRoute, p, ratelimit.Subject{UserID: ids.New(), DialogID: full}); !d.Allowed {
				t.Fatal("first send into the dialog denied")
			}
			bob := ratelimit.Subject{UserID: ids.New(), DialogID: ids.New()}
			if d, _ := l.Decide(ctx, sendRoute, p, bob); !d.Allowed {
				t.Fatal("bob's first send denied")
			}
			bobUser := ratelimit.Key(ratelimit.FamilyUser, bob.UserID, ratelimit.RouteHash(sendRoute), a, time.Hour)
			var zcard int64
			var counterBefore string
			if a == ratelimit.SlidingLog {
				zcard = ad.ZCard(ctx, bobUser).Val()
			}
			if a == ratelimit.FixedWindow {
				counterBefore = ad.Get(ctx, bobUser).Val()
			}
			bob.DialogID = full
			d, err := l.Decide(ctx, sendRoute, p, bob)
			if err != nil || d.Allowed {
				t.Fatalf("bob into the full dialog: %+v %v", d, err)
			}
			if got := counter(t, reg, "han_ratelimit_refunds_total", map[string]string{"result": "ok"}); got != 1 {
				t.Fatalf("refunds ok = %v, want 1: the per-family path did not run", got)
			}
			switch a {
			case ratelimit.SlidingLog:
				if n := ad.ZCard(ctx, bobUser).Val(); n != zcard {
					t.Fatalf("user log %d entries after the refund, want %d", n, zcard)
				}
			case ratelimit.FixedWindow:
				if v := ad.Get(ctx, bobUser).Val(); v != counterBefore {
					t.Fatalf("user counter %q after the refund, want %q", v, counterBefore)
				}
			}
			// Whatever the algorithm: the refunded request does not count.
			bob.DialogID = ids.New()
			d, err = l.Decide(ctx, sendRoute, p, bob)
			if err != nil || !d.Allowed || d.Families[0].Remaining != 3 {
				t.Fatalf("bob's next send: %+v %v (user remaining must be 5-2=3)", d, err)
			}
		})
	}
}

// Refund gives back one family's admission of an allowed request and leaves
// the request's other families charged, in both modes and for every
// algorithm: the next request meets that family as if the refunded one had
// never been made. A denial has nothing to give back.
func TestRefundGivesBackOnlyThatFamilysAdmission(t *testing.T) {
	c := client(t, env.Redis)
	ctx := context.Background()
	modes := map[string]ratelimit.Mode{"atomic": ratelimit.ModeAtomic, "per-family": ratelimit.ModePerFamily}
	for name, mode := range modes {
		for _, a := range algorithms {
			t.Run(name+"/"+string(a), func(t *testing.T) {
				p := sendPolicy(a) // user 5, ip 5, dialog 1 per hour
				l, reg := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, func(c *ratelimit.Config) { c.Mode = mode })
				s := ratelimit.Subject{UserID: ids.New(), IPHMAC: ids.New()[:16], DialogID: ids.New()}
				d, err := l.Decide(ctx, sendRoute, p, s)
				if err != nil || !d.Allowed || len(d.Families) != 3 {
					t.Fatalf("first send: %+v %v", d, err)
				}
				l.Refund(ctx, d, ratelimit.FamilyDialog, "test")
				if got := counter(t, reg, "han_ratelimit_refunds_total", map[string]string{"result": "test"}); got != 1 {
					t.Fatalf("refunds counted %v, want 1", got)
				}
				d, err = l.Decide(ctx, sendRoute, p, s)
				if err != nil || !d.Allowed {
					t.Fatalf("second send into a dialog of limit 1 whose first admission was given back: %+v %v", d, err)
				}
				if u, ip, dl := d.Families[0].Remaining, d.Families[1].Remaining, d.Families[2].Remaining; u != 3 || ip != 3 || dl != 0 {
					t.Fatalf("remaining user %d ip %d dialog %d, want 3 3 0: only the dialog's admission is given back", u, ip, dl)
				}
				d, err = l.Decide(ctx, sendRoute, p, s)
				if err != nil || d.Allowed {
					t.Fatalf("third send: %+v %v, want the dialog's denial", d, err)
				}
				l.Refund(ctx, d, ratelimit.FamilyDialog, "test")
				if got := counter(t, reg, "han_ratelimit_refunds_total", map[string]string{"result": "test"}); got != 1 {
					t.Fatalf("a denial was refunded: refunds counted %v", got)
				}
			})
		}
	}
}

// DecideLocal grants a fail-closed policy the in-process fallback's share of
// its limits (a caller that still serves the request when Redis fails keeps
// it bounded) and counts its decisions as fallback ones.
func TestDecideLocalGrantsTheFallbackShare(t *testing.T) {
	c := client(t, env.Redis)
	p := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{user(8, time.Minute)}}
	l, reg := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, nil)
	s := ratelimit.Subject{UserID: ids.New()}
	for i := range 2 {
		if d := l.DecideLocal(sendRoute, p, s); !d.Allowed || !d.Local || d.Families[0].Rule.Limit != 2 {
			t.Fatalf("local decision %d: %+v", i, d)
		}
	}
	d := l.DecideLocal(sendRoute, p, s)
	if d.Allowed || !d.Local || d.RetryAfterSeconds() < 1 || d.RetryAfterSeconds() > 30 {
		t.Fatalf("third local decision: %+v, want a denial until one of 2 tokens per minute refills", d)
	}
	if d := l.DecideLocal(sendRoute, p, ratelimit.Subject{UserID: ids.New()}); !d.Allowed {
		t.Fatalf("another user's local decision: %+v", d)
	}
	for result, want := range map[string]float64{"fallback": 3, "fallback_denied": 1} {
		if got := counter(t, reg, "han_ratelimit_decisions_total", map[string]string{"route": sendRoute, "result": result}); got != want {
			t.Fatalf("%s decisions counted %v, want %v", result, got, want)
		}
	}
}

// Redis killed: a FallbackLocal route keeps deciding in-process with a
// fraction of its limit; a FailClosed route fails fast with
// ErrRedisUnavailable; once Redis is back, decisions come from Redis again.
func TestRedisDownFallsBackOrFailsClosed(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	c := client(t, r)
	const get, post = "GET /v1/dialogs/{id}/messages", "POST /v1/dialogs/{id}/messages"
	routes := map[string]ratelimit.Policy{
		get:  {Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FallbackLocal, Rules: []ratelimit.Rule{user(8, time.Minute)}},
		post: {Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{user(8, time.Minute)}},
	}
	const budget = 500 * time.Millisecond
	l, reg := newLimiter(t, c, routes, nil)
	ctx := context.Background()
	alice := ratelimit.Subject{UserID: ids.New()}
	if d, err := l.Decide(ctx, post, routes[post], alice); err != nil || d.Local {
		t.Fatalf("with Redis up: %+v %v", d, err)
	}
	r.Kill()

	start := time.Now()
	_, err = l.Decide(ctx, post, routes[post], alice)
	if !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("fail-closed route with Redis down: %v", err)
	}
	if el := time.Since(start); el > 3*budget {
		t.Fatalf("fail-closed decision took %v, budget %v", el, budget)
	}
	// 8/min scaled by the default fraction 0.25: two requests, then 429.
	for i := range 2 {
		d, err := l.Decide(ctx, get, routes[get], alice)
		if err != nil || !d.Allowed || !d.Local || d.Families[0].Rule.Limit != 2 {
			t.Fatalf("fallback request %d: %+v %v", i, d, err)
		}
	}
	d, err := l.Decide(ctx, get, routes[get], alice)
	if err != nil || d.Allowed || !d.Local || d.RetryAfterSeconds() < 1 {
		t.Fatalf("third fallback request: %+v %v", d, err)
	}
	if got := counter(t, reg, "han_ratelimit_decisions_total", map[string]string{"route": get, "result": "fallback"}); got != 2 {
		t.Fatalf("fallback decisions counted %v, want 2", got)
	}
	if got := counter(t, reg, "han_ratelimit_decisions_total", map[string]string{"route": post, "result": "error"}); got != 1 {
		t.Fatalf("error decisions counted %v, want 1", got)
	}

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		d, err := l.Decide(ctx, post, routes[post], alice)
		return err == nil && d.Allowed && !d.Local
	}, "Redis decisions did not resume after the restart")
}

// Scripts refused for OOM: the fail-closed route answers ErrRedisOOM, the
// fallback route keeps deciding in-process.
func TestRedisOOM(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	c := client(t, r)
	ad := admin(t, r)
	ctx := context.Background()
	fillUntilOOM(t, ad)
	routes := map[string]ratelimit.Policy{
		"GET /r":  {Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FallbackLocal, Rules: []ratelimit.Rule{user(8, time.Minute)}},
		"POST /w": {Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{user(8, time.Minute)}},
	}
	l, _ := newLimiter(t, c, routes, nil)
	alice := ratelimit.Subject{UserID: ids.New()}
	if _, err := l.Decide(ctx, "POST /w", routes["POST /w"], alice); !errors.Is(err, rds.ErrRedisOOM) {
		t.Fatalf("fail-closed route under OOM: %v", err)
	}
	d, err := l.Decide(ctx, "GET /r", routes["GET /r"], alice)
	if err != nil || !d.Allowed || !d.Local {
		t.Fatalf("fallback route under OOM: %+v %v", d, err)
	}
	if n, _ := ad.Exists(ctx, ratelimit.Key(ratelimit.FamilyUser, alice.UserID, ratelimit.RouteHash("POST /w"), ratelimit.SlidingLog, time.Minute)).Result(); n != 0 {
		t.Fatal("a key was written under OOM")
	}
}

// fillUntilOOM writes 2 MiB of filler (outside han:*) and lowers maxmemory
// to 1 MiB under noeviction, so every write is refused until the test ends.
func fillUntilOOM(t *testing.T, ad *redis.Client) {
	t.Helper()
	ctx := context.Background()
	chunk := strings.Repeat("x", 256<<10)
	for i := range 8 {
		if err := ad.Set(ctx, fmt.Sprintf("filler:%d", i), chunk, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ad.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := ad.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("Redis is not refusing writes: %v", err)
	}
}

// When the ACL refuses the expiry command, the scripts write nothing and
// the limiter reports ErrExpiryDenied.
func TestExpiryDeniedWritesNothing(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	c := client(t, r)
	ad := admin(t, r)
	ctx := context.Background()
	if err := ad.Do(ctx, "ACL", "SETUSER", rds.APIBackendUser, "-pexpire", "-pexpireat").Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range algorithms {
		p := sendPolicy(a)
		l, _ := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, nil)
		_, err := l.Decide(ctx, sendRoute, p, ratelimit.Subject{UserID: ids.New(), IPHMAC: "cc", DialogID: ids.New()})
		if !errors.Is(err, rds.ErrExpiryDenied) {
			t.Fatalf("%s: %v", a, err)
		}
	}
	if n, _ := ad.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("%d keys written although the expiry was denied", n)
	}
}

func TestScriptsRejectBadArguments(t *testing.T) {
	c := client(t, env.Redis)
	for _, a := range algorithms {
		key := userKey(a, time.Second)
		for _, args := range [][]any{{"id", 0, 1000, 0}, {"id", 1, 0, 0}, {"id", 1, 1000}, {"id", "x", 1000, 0}} {
			if err := scripts[a].Run(context.Background(), c, []string{key}, args...).Err(); err == nil || !strings.Contains(err.Error(), "invalid_argument") {
				t.Fatalf("%s %v: %v", a, args, err)
			}
		}
	}
}
