package rds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// A Redis that is down refuses connections at once, and so must every call
// to it: a request, a presence heartbeat or a socket's subscribe answers
// "unavailable" without spending its budget. go-redis dials a refused
// address five times by default, 100 ms apart, then retries the command
// (and the script runner once more): a call to a dead Redis took 0.8–1.2 s,
// the whole budget of a request. Here each kind of call — a read, a script,
// a pipeline, and the same through the shared Batcher — fails well inside
// a tenth of a long budget.
func TestCallsToARedisThatRefusesFailFast(t *testing.T) {
	const budget = 5 * time.Second
	r, rdb := testenv.StallableRedis(t, 0, budget)
	b := rds.NewBatcher(rdb)
	t.Cleanup(b.Close)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	script := lua.LockRelease
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"GET", func() error { return rdb.Get(ctx, "han:api:refused").Err() }},
		{"script", func() error {
			return script.Run(ctx, rdb, []string{"han:coord:lock:refused:{x}"}, "token").Err()
		}},
		{"pipeline", func() error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Get(ctx, "han:api:refused")
				return nil
			})
			return err
		}},
		{"batched script", func() error {
			return b.Script(ctx, script, []string{"han:coord:lock:refused:{x}"}, "token").Err()
		}},
		{"batched publish", func() error {
			return b.Publish(ctx, rds.PubSubAuto, "han:rt:refused", []byte("x")).Err()
		}},
	} {
		for i := range 3 { // a first call, and calls after the pool saw failures
			start := time.Now()
			err := c.call()
			took := time.Since(start)
			if !errors.Is(rds.ClassifyRedisError(err), rds.ErrRedisUnavailable) {
				t.Fatalf("%s #%d against a killed Redis: %v, want unavailable", c.name, i, err)
			}
			if took > budget/10 {
				t.Errorf("%s #%d against a Redis that refuses connections took %v (budget %v)", c.name, i, took, budget)
			}
		}
	}
}
