package ratelimit_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store/rds"
)

// BenchmarkDecision measures rate-limit decisions per second of each script
// and of go-redis/redis_rate (GCRA, the baseline) against one private
// redis-server in the same run, with the same client, ACL and concurrency.
// Every decision is admitted (the limit is far above the rate), spread over
// 1000 identities. docs/benchmarks.md keeps the figures.
//
//	go test -run '^$' -bench BenchmarkDecision -benchtime 3s ./ratelimit/
func BenchmarkDecision(b *testing.B) {
	// A user with api_backend's rule plus redis_rate's "rate:" prefix, so
	// both limiters run under the same ACL.
	const pw = "bench-password-0123456789"
	rule := strings.Replace(rds.APIBackendRule(pw, false), "user "+rds.APIBackendUser+" ", "user bench ", 1) + " ~rate:*"
	r, err := testenv.StartRedis(testenv.RedisOptions{ExtraACL: []string{rule}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Stop()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "bench", Password: pw, PoolSize: 32})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		b.Fatal(err)
	}

	const identities = 1000
	subjects := make([]string, identities)
	for i := range subjects {
		subjects[i] = "u" + strconv.Itoa(i)
	}
	rh := ratelimit.RouteHash("POST /bench")
	big := ratelimit.Rule{Family: ratelimit.FamilyUser, Limit: 1_000_000, Window: time.Second}

	run := func(b *testing.B, decide func(i int) error) {
		var n atomic.Int64
		b.SetParallelism(8)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := decide(int(n.Add(1) % identities)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	}
	for _, a := range []ratelimit.Algorithm{ratelimit.SlidingLog, ratelimit.FixedWindow, ratelimit.TokenBucket} {
		keys := make([][]string, identities)
		for i := range keys {
			keys[i] = []string{ratelimit.Key(ratelimit.FamilyUser, subjects[i], rh, a, big.Window)}
		}
		b.Run(string(a), func(b *testing.B) {
			run(b, func(i int) error {
				d, err := ratelimit.Eval(ctx, c, a, "r"+strconv.Itoa(i)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), keys[i], []ratelimit.Rule{big})
				if err == nil && !d.Allowed {
					b.Fatal("denied")
				}
				return err
			})
		})
	}
	// The message-send shape: user + ip + dialog in one script, through
	// Limiter.Decide (key building, request ids, metrics included).
	send := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, Rules: []ratelimit.Rule{
		big, {Family: ratelimit.FamilyIP, Limit: 1_000_000, Window: time.Second}, {Family: ratelimit.FamilyDialog, Limit: 1_000_000, Window: time.Second},
	}}
	lim, err := ratelimit.New(ratelimit.Config{Redis: c, Policies: ratelimit.Static{Set: ratelimit.MustPolicySet("bench", map[string]ratelimit.Policy{ratelimit.MessageSendRoute: send}, ratelimit.Policy{})}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sliding_3families_decide", func(b *testing.B) {
		run(b, func(i int) error {
			d, err := lim.Decide(ctx, ratelimit.MessageSendRoute, send, ratelimit.Subject{UserID: subjects[i], IPHMAC: subjects[(i+1)%identities], DialogID: subjects[(i+2)%identities]})
			if err == nil && !d.Allowed {
				b.Fatal("denied")
			}
			return err
		})
	})
	b.Run("redis_rate_gcra", func(b *testing.B) {
		rl := redis_rate.NewLimiter(c)
		limit := redis_rate.PerSecond(1_000_000)
		keys := make([]string, identities)
		for i := range keys {
			keys[i] = "han:api:bench:" + subjects[i]
		}
		run(b, func(i int) error {
			res, err := rl.Allow(ctx, keys[i], limit)
			if err == nil && res.Allowed != 1 {
				b.Fatal("denied")
			}
			return err
		})
	})
}
