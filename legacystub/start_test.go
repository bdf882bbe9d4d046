package legacystub_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// A stalled DB2 (paused, not refusing) does not hold every send: after one
// task write timed out, Start skips DB2 for the cooldown and counts the
// skips. A skipped task is not lost: its stub_tasks row is pending, a poll
// answers pending however often it is polled (DB2 never got the task), and
// recovery decides it. Once the cooldown is over and DB2 answers again, the
// next Start writes its task into DB2.
func TestStartSkipsAStalledDB2AndRecoveryDecidesTheSkippedTasks(t *testing.T) {
	ctx := context.Background()
	cfg := legacystub.Config{RedisTimeout: 300 * time.Millisecond, CreateCooldown: 400 * time.Millisecond}
	f := newFixture(t, cfg)
	f.drain()
	srv, db2 := stallableDB2(t, cfg.RedisTimeout)
	reg := prometheus.NewRegistry()
	stub, err := legacystub.New(cfg, legacystub.Deps{DB2: db2, Store: f.store, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	events := func(event string) float64 { return stubEvents(t, reg, event) }

	thaw := srv.Freeze(t)
	first := f.send(false)
	stub.Start(ctx, first) // waits out RedisTimeout: DB2 is found unreachable
	skipped := []string{f.send(false), f.send(false), f.send(false)}
	start := time.Now()
	for _, id := range skipped {
		stub.Start(ctx, id)
	}
	if took := time.Since(start); took >= cfg.RedisTimeout {
		t.Fatalf("three starts during the cooldown took %s: they waited for the stalled DB2", took.Round(time.Millisecond))
	}
	if failed, skips := events("create_failed"), events("create_skipped"); failed != 1 || skips != 3 {
		t.Fatalf("create_failed %v, create_skipped %v; want 1 and 3", failed, skips)
	}
	thaw()

	// DB2 answers again but never got the skipped tasks: they stay pending.
	for range cfg.VerdictAfterPolls + 3 {
		if s, err := stub.Poll(ctx, skipped[0]); err != nil || s != legacystub.SafetyPending {
			t.Fatalf("poll of a task DB2 never got: %q %v", s, err)
		}
	}
	f.age(append(skipped, first)...)
	if n, err := stub.NewRecoverer(f.db1, "inst-a").RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("recovery decided %d of the 4 tasks (%v)", n, err)
	}
	for _, id := range append(skipped, first) {
		if row := f.task(id); row.State != store.StubDone || row.DecidedBy != store.DecidedByRecovery {
			t.Fatalf("task %s: %+v", id, row)
		}
	}

	// After the cooldown one Start tries DB2 again, and it answers.
	time.Sleep(cfg.CreateCooldown)
	next := f.send(false)
	stub.Start(ctx, next)
	if n := db2.Exists(ctx, store.StubTaskKey(next)).Val(); n != 1 {
		t.Fatal("the first start after the cooldown did not write its task into DB2")
	}
	if c := events("created"); c != 1 {
		t.Fatalf("created %v, want 1", c)
	}
}

// stubEvents reads han_legacy_stub_tasks_total{event} from reg (0 when the
// event never happened).
func stubEvents(t *testing.T, reg *prometheus.Registry, event string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "han_legacy_stub_tasks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" && l.GetValue() == event {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// stallableDB2 is testenv.StallableRedis for DB2 as ACL user legacy_stub:
// a redis-server of the test's own, for Freeze, and a client whose every
// call gives up after budget.
func stallableDB2(t *testing.T, budget time.Duration) (*testenv.RedisServer, redis.UniversalClient) {
	t.Helper()
	srv, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-stall-password"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c, err := rds.NewRedis(srv.LegacyStubURL(2), rds.RedisConfig{DialTimeout: budget, ReadTimeout: budget, WriteTimeout: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	testenv.WarmPool(t, c)
	return srv, c
}
