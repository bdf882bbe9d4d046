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
	f, srv, db2, stub, reg := stalledDB2Stub(t, cfg)
	events := func(event string) float64 { return stubEvents(t, reg, event) }

	// The messages are written first, so the cooldown covers the starts
	// alone, however slow PostgreSQL is.
	first := f.send(false)
	skipped := []string{f.send(false), f.send(false), f.send(false)}
	thaw := srv.Freeze(t)
	stub.Start(ctx, first) // waits out RedisTimeout: DB2 is found unreachable
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

// An answer from a live DB2 (here out of memory) to the write that tries
// it again after the cooldown closes the breaker: the starts that follow
// try DB2 each, none is skipped, as when DB2 wrote. (The breaker used to
// stay half-open, letting one start at a time through and skipping the
// others until a write succeeded.)
func TestAnAnsweredRefusalClosesTheStartBreaker(t *testing.T) {
	ctx := context.Background()
	cfg := legacystub.Config{RedisTimeout: 300 * time.Millisecond, CreateCooldown: 200 * time.Millisecond}
	f, srv, _, stub, reg := stalledDB2Stub(t, cfg)
	ids := []string{f.send(false), f.send(false), f.send(false), f.send(false)}
	thaw := srv.Freeze(t)
	stub.Start(ctx, ids[0]) // DB2 found unreachable: the breaker opens
	thaw()
	time.Sleep(cfg.CreateCooldown)
	admin := srv.AdminClient(0)
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	stub.Start(ctx, ids[1]) // the try after the cooldown: refused (OOM), answered
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// Two starts at once against a stalled DB2: both try it.
	thaw = srv.Freeze(t)
	done := make(chan struct{})
	go func() {
		stub.Start(ctx, ids[2])
		close(done)
	}()
	time.Sleep(50 * time.Millisecond) // the first is waiting on DB2
	stub.Start(ctx, ids[3])
	<-done
	thaw()
	if skips := stubEvents(t, reg, "create_skipped"); skips != 0 {
		t.Fatalf("%v starts skipped DB2 after it answered: the breaker stayed half-open", skips)
	}
}

// stalledDB2Stub is a stub with cfg over a fixture with no task left and a
// DB2 of its own, which the test may freeze; reg holds the stub's metrics.
func stalledDB2Stub(t *testing.T, cfg legacystub.Config) (*fixture, *testenv.RedisServer, redis.UniversalClient, *legacystub.Stub, *prometheus.Registry) {
	t.Helper()
	f := newFixture(t, cfg)
	f.drain()
	srv, db2 := stallableDB2(t, cfg.RedisTimeout)
	reg := prometheus.NewRegistry()
	stub, err := legacystub.New(cfg, legacystub.Deps{DB2: db2, Store: f.store, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return f, srv, db2, stub, reg
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
