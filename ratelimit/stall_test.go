package ratelimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store/rds"
)

// A Redis that stalls instead of failing runs the decisions it had received
// when it wakes, after their requests were refused (503: the send route
// fails closed). Their sliding-log admissions would then count requests
// that never happened for the whole window, and a client that retried
// through the stall would meet 429. The limiter gives such admissions back
// before its next decision once Redis answers: the user's next request is
// admitted, and only it is counted.
func TestStalledDecisionsDoNotSpendTheLimit(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode ratelimit.Mode
	}{{"atomic", ratelimit.ModeAtomic}, {"per-family", ratelimit.ModePerFamily}} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			const budget = 200 * time.Millisecond
			r, c := testenv.StallableRedis(t, 0, budget)
			ad := admin(t, r)
			const limit = 3
			p := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{
				user(limit, time.Hour), {Family: ratelimit.FamilyIP, Limit: 100, Window: time.Hour}}}
			l, reg := newLimiter(t, c, map[string]ratelimit.Policy{sendRoute: p}, func(cfg *ratelimit.Config) {
				cfg.Mode, cfg.Timeout, cfg.Cooldown = mode.mode, budget, time.Millisecond
			})
			label, pol := l.Policies().Lookup("POST", "/v1/dialogs/{id}/messages")
			u := ratelimit.Subject{UserID: ids.New(), IPHMAC: "ip-" + ids.New()}
			userKey := ratelimit.Key(ratelimit.FamilyUser, u.UserID, ratelimit.RouteHash(label), ratelimit.SlidingLog, time.Hour)

			// As on a running service the script is loaded (so a stalled
			// EVALSHA runs when Redis wakes instead of answering NOSCRIPT)
			// and the pool holds open connections (a connection dialled
			// to a stopped Redis never gets its command sent).
			concurrently := func(s ratelimit.Subject, check func(ratelimit.Decision, error)) {
				var wg sync.WaitGroup
				for range limit {
					wg.Go(func() { check(l.Decide(ctx, label, pol, s)) })
				}
				wg.Wait()
			}
			concurrently(ratelimit.Subject{UserID: ids.New(), IPHMAC: "warm"}, func(d ratelimit.Decision, err error) {
				if err != nil || !d.Allowed {
					t.Errorf("warm-up decision: %+v %v", d, err)
				}
			})

			thaw := r.Freeze(t)
			concurrently(u, func(_ ratelimit.Decision, err error) {
				if !errors.Is(err, rds.ErrRedisUnavailable) {
					t.Errorf("decision against a stopped Redis: %v", err)
				}
			})
			thaw()
			testenv.Eventually(t, 5*time.Second, func() bool { return ad.ZCard(ctx, userKey).Val() >= 1 },
				"the stalled decisions never ran: the test does not show what it means to")
			time.Sleep(200 * time.Millisecond)
			// Those that had reached Redis (the calls on a connection dialled
			// while it was stopped were never sent).
			landed := ad.ZCard(ctx, userKey).Val()
			t.Logf("%d of %d refused requests counted after Redis woke", landed, limit)

			var d ratelimit.Decision
			var err error
			testenv.Eventually(t, 5*time.Second, func() bool {
				d, err = l.Decide(ctx, label, pol, u)
				return err == nil
			}, "no decision after Redis woke")
			if !d.Allowed {
				t.Fatalf("the first request after the stall was denied (%+v): the refused requests' admissions were counted", d)
			}
			if n := ad.ZCard(ctx, userKey).Val(); n != 1 {
				t.Fatalf("%d admissions counted, want only the request that went ahead", n)
			}
			if n := counter(t, reg, "han_ratelimit_refunds_total", map[string]string{"result": "unanswered"}); n != float64(landed) {
				t.Fatalf("refunds of unanswered decisions counted %v, want %d", n, landed)
			}
			// The user has the rest of the limit: limit-1 more, then 429.
			for i := range limit - 1 {
				if d, err := l.Decide(ctx, label, pol, u); err != nil || !d.Allowed {
					t.Fatalf("request %d after the stall: %+v %v", i+2, d, err)
				}
			}
			if d, err := l.Decide(ctx, label, pol, u); err != nil || d.Allowed {
				t.Fatalf("the limit must still hold: %+v %v", d, err)
			}
		})
	}
}
