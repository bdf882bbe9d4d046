package legacystub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

func TestConfigRefusesATTLShorterThanTheBudgets(t *testing.T) {
	def, err := legacystub.Config{}.Validate()
	if err != nil {
		t.Fatalf("the defaults must be valid: %v", err)
	}
	if def.TaskTTL != 180*time.Second || def.PollBudget() != 60*time.Second || def.RecoveryBudget != 120*time.Second {
		t.Fatalf("defaults: TTL %s, poll budget %s, recovery %s", def.TaskTTL, def.PollBudget(), def.RecoveryBudget)
	}
	for _, tc := range []struct {
		name string
		cfg  legacystub.Config
		ok   bool
	}{
		{"ttl equal to the budget", legacystub.Config{TaskTTL: 180 * time.Second}, true},
		{"ttl one second short", legacystub.Config{TaskTTL: 179 * time.Second}, false},
		{"more polls than the ttl covers", legacystub.Config{MaxPolls: 31, TaskTTL: 180 * time.Second}, false},
		{"longer poll interval, derived ttl", legacystub.Config{PollInterval: 5 * time.Second}, true},
		{"longer poll interval, old ttl", legacystub.Config{PollInterval: 5 * time.Second, TaskTTL: 180 * time.Second}, false},
		{"recovery budget shorter than interval + lease", legacystub.Config{RecoveryBudget: 40 * time.Second}, false},
		{"verdict after more polls than allowed", legacystub.Config{VerdictAfterPolls: 31}, false},
		{"negative max polls", legacystub.Config{MaxPolls: -1}, false},
		// 1h × 3,000,000 wraps past a duration's range to a negative budget,
		// which an hour's TTL would have passed.
		{"poll budget past a duration's range", legacystub.Config{PollInterval: time.Hour, MaxPolls: 3_000_000, TaskTTL: time.Hour}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.cfg.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
			}
			if err == nil && c.TaskTTL < c.PollBudget()+c.RecoveryBudget {
				t.Fatalf("accepted a TTL %s below the budget %s", c.TaskTTL, c.PollBudget()+c.RecoveryBudget)
			}
			if err != nil && !errors.Is(err, legacystub.ErrConfig) {
				t.Fatalf("error must wrap ErrConfig: %v", err)
			}
		})
	}
	if _, err := legacystub.New(legacystub.Config{TaskTTL: time.Minute}, legacystub.Deps{}); !errors.Is(err, legacystub.ErrConfig) {
		t.Fatalf("New must refuse a short TTL: %v", err)
	}
}

// A send creates the task in DB2 with a TTL longer than the poll budget;
// polls count, a random verdict appears at the configured poll, and the
// verdict is durable in PostgreSQL (it survives the loss of DB2).
func TestPollReachesAVerdict(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	id := f.send(true)

	key := store.StubTaskKey(id)
	ttl := f.admin.PTTL(ctx, key).Val()
	cfg := f.stub.Config()
	if ttl <= cfg.PollBudget() || ttl > cfg.TaskTTL {
		t.Fatalf("task PTTL %s must exceed the poll budget %s (TTL %s)", ttl, cfg.PollBudget(), cfg.TaskTTL)
	}
	if h := f.admin.HGetAll(ctx, key).Val(); h["state"] != "pending" || h["polls"] != "0" {
		t.Fatalf("new task: %v", h)
	}
	for i := 1; i < cfg.VerdictAfterPolls; i++ {
		if s, err := f.stub.Poll(ctx, id); err != nil || s != legacystub.SafetyPending {
			t.Fatalf("poll %d: %q %v", i, s, err)
		}
	}
	verdict, err := f.stub.Poll(ctx, id)
	if err != nil || (verdict != legacystub.SafetyApproved && verdict != legacystub.SafetyRejected) {
		t.Fatalf("poll %d must decide: %q %v", cfg.VerdictAfterPolls, verdict, err)
	}
	row := f.task(id)
	if row.State != store.StubDone || row.Verdict != verdict || row.DecidedBy != store.DecidedByPoll {
		t.Fatalf("PostgreSQL row: %+v", row)
	}
	for i := 0; i < 3; i++ {
		if s, err := f.stub.Poll(ctx, id); err != nil || s != verdict {
			t.Fatalf("the verdict must not change: %q %v", s, err)
		}
	}
	// DB2 lost (cutover, flush, restore): the decided verdict still answers.
	f.admin.Del(ctx, key)
	if s, err := f.stub.Poll(ctx, id); err != nil || s != verdict {
		t.Fatalf("after DB2 lost the task: %q %v", s, err)
	}
	if _, err := f.stub.Poll(ctx, ids.New()); !errors.Is(err, store.ErrStubTaskNotFound) {
		t.Fatalf("a message without a task: %v", err)
	}
}

// Both verdicts occur: the verdict is drawn at random per task.
func TestVerdictIsRandom(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{VerdictAfterPolls: 1})
	seen := map[string]bool{}
	for i := 0; i < 64 && len(seen) < 2; i++ {
		id := f.send(true)
		v, err := f.stub.Poll(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		seen[v] = true
	}
	if !seen[legacystub.SafetyApproved] || !seen[legacystub.SafetyRejected] {
		t.Fatalf("64 tasks gave only %v", seen)
	}
}

// A poll is a request: its PostgreSQL statements are bounded by the request
// budget, so a lock that holds them longer (a migration altering
// stub_tasks, a transaction stuck on the task's row) answers database busy
// (503 database_busy) instead of holding the request and a pool connection
// for as long as the lock lasts. Once the lock is gone the poll goes on.
func TestPollUnderALockAnswersDatabaseBusy(t *testing.T) {
	f := newFixture(t, legacystub.Config{VerdictAfterPolls: 1})
	f.store.SetRequestTimeout(500 * time.Millisecond)
	// The table locked: the task's read waits.
	id := f.send(true)
	f.pollUnderLock(id, "LOCK TABLE stub_tasks IN ACCESS EXCLUSIVE MODE")
	// The task's row locked: the read passes, the poll reaches a verdict in
	// DB2, and recording it waits.
	id2 := f.send(true)
	f.pollUnderLock(id2, "SELECT 1 FROM stub_tasks WHERE message_id = $1 FOR UPDATE", id2)
	if v := f.task(id2).Verdict; v != f.admin.HGet(context.Background(), store.StubTaskKey(id2), "verdict").Val() {
		t.Fatalf("the verdict recorded after the lock (%q) is not the one DB2 reached", v)
	}
}

// pollUnderLock polls task id while another transaction holds lockSQL: the
// poll must answer database busy well before the lock goes (generous bound:
// many request budgets). After the lock goes the poll answers a verdict.
func (f *fixture) pollUnderLock(id, lockSQL string, args ...any) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, lockSQL, args...); err != nil {
		f.t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx) // a client that waits; only the test gives up
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := f.stub.Poll(pctx, id)
		done <- err
	}()
	bound := 20 * f.store.RequestTimeout()
	select {
	case err := <-done:
		if !store.IsDatabaseBusy(err) {
			f.t.Fatalf("poll under %q: %v, want database busy", lockSQL, err)
		}
	case <-time.After(bound):
		cancel()
		<-done
		f.t.Fatalf("poll under %q still waiting after %s (request budget %s)", lockSQL, bound, f.store.RequestTimeout())
	}
	if err := tx.Rollback(ctx); err != nil {
		f.t.Fatal(err)
	}
	if v, err := f.stub.Poll(ctx, id); err != nil || (v != legacystub.SafetyApproved && v != legacystub.SafetyRejected) {
		f.t.Fatalf("poll after the lock went: %q %v", v, err)
	}
}

// drain decides every stuck task other tests left behind, so counts below
// are this test's own.
func (f *fixture) drain() {
	f.t.Helper()
	r := f.stub.NewRecoverer(f.db1, "drain")
	for {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			f.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// Stuck tasks (never polled to a verdict, or lost in DB2) are recovered by
// two concurrent recoverers: every task is decided exactly once.
func TestConcurrentRecoverersDecideEachTaskOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	f.drain()
	var tasks []string
	for i := 0; i < 12; i++ {
		tasks = append(tasks, f.send(i%3 != 0)) // every third one never reached DB2
	}
	// Not stuck yet: inside the poll budget nothing is recovered.
	r1, r2 := f.stub.NewRecoverer(f.db1, "inst-a"), f.stub.NewRecoverer(f.db1, "inst-b")
	if n, err := r1.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("tasks inside the poll budget were recovered: %d %v", n, err)
	}
	// One task's poll reached a verdict in DB2 that PostgreSQL never got:
	// recovery keeps it.
	f.admin.HSet(ctx, store.StubTaskKey(tasks[1]), "state", "done", "verdict", "rejected")
	f.age(tasks...)

	var wg sync.WaitGroup
	var counts [2]int
	for i, r := range []*legacystub.Recoverer{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := r.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		}()
	}
	wg.Wait()
	if counts[0]+counts[1] != len(tasks) {
		t.Fatalf("recovered %v, want %d in total", counts, len(tasks))
	}
	for _, id := range tasks {
		row := f.task(id)
		if row.State != store.StubDone || row.DecidedBy != store.DecidedByRecovery || row.Recoveries != 1 {
			t.Fatalf("task %s: %+v", id, row)
		}
	}
	if v := f.task(tasks[1]).Verdict; v != "rejected" {
		t.Fatalf("recovery must keep the verdict DB2 reached, got %q", v)
	}
	// Decided tasks answer polls with their verdict; nothing is left.
	if s, err := f.stub.Poll(ctx, tasks[0]); err != nil || s != f.task(tasks[0]).Verdict {
		t.Fatalf("poll after recovery: %q %v", s, err)
	}
	if n, err := r2.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a second round decided %d (%v)", n, err)
	}
	// No recovery lock outlives its round.
	for _, id := range tasks {
		if n := f.db1.Exists(ctx, rds.LockKey(rds.LockSafetyRecovery, id)).Val(); n != 0 {
			t.Fatalf("recovery lock of %s left behind", id)
		}
	}
}

// The Redis lock is an optimisation: when it is lost (expired, deleted,
// DB1 restored empty) while a recoverer works, the PostgreSQL lease still
// keeps a second recoverer from deciding the task; and a recoverer whose
// lease expired and was taken over cannot decide it either.
func TestLeaseIsTheRealGuard(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	f.drain()
	id := f.send(true)
	f.age(id)

	a, b := f.stub.NewRecoverer(f.db1, "inst-a"), f.stub.NewRecoverer(f.db1, "inst-b")
	lockKey := rds.LockKey(rds.LockSafetyRecovery, id)
	inLease, release := make(chan struct{}), make(chan struct{})
	legacystub.SetAfterLease(a, func(string) {
		close(inLease)
		<-release
	})
	type result struct {
		n   int
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		n, err := a.RunOnce(ctx)
		aDone <- result{n, err}
	}()
	<-inLease
	if ttl := f.db1.PTTL(ctx, lockKey).Val(); ttl <= 0 || ttl > f.stub.Config().RecoveryLease {
		t.Fatalf("recovery lock while A works: PTTL %s", ttl)
	}
	// The lock vanishes while A still works.
	admin1 := env.Redis.AdminClient(1)
	defer admin1.Close()
	admin1.Del(ctx, lockKey)
	// B could take the lock now, but A's lease keeps the task out of B's
	// claim: it decides nothing.
	if n, err := b.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("B decided %d tasks (%v) while A held the lease", n, err)
	}
	close(release)
	if r := <-aDone; r.err != nil || r.n != 1 {
		t.Fatalf("A: %d %v", r.n, r.err)
	}
	if row := f.task(id); row.Recoveries != 1 || row.State != store.StubDone {
		t.Fatalf("task: %+v", row)
	}

	// Lease takeover: A's lease expires mid-recovery and B takes the task
	// over; A's late finish is refused.
	id2 := f.send(false)
	f.age(id2)
	inLease2, release2 := make(chan struct{}), make(chan struct{})
	legacystub.SetAfterLease(a, func(string) {
		close(inLease2)
		<-release2
	})
	go func() {
		n, err := a.RunOnce(ctx)
		aDone <- result{n, err}
	}()
	<-inLease2
	admin1.Del(ctx, rds.LockKey(rds.LockSafetyRecovery, id2))
	if _, err := f.pool.Exec(ctx, "UPDATE stub_tasks SET lease_until = now() - interval '1 second' WHERE message_id=$1", id2); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("B must take over an expired lease: %d %v", n, err)
	}
	close(release2)
	if r := <-aDone; r.err != nil || r.n != 0 {
		t.Fatalf("A decided after losing its lease: %d %v", r.n, r.err)
	}
	if row := f.task(id2); row.Recoveries != 1 {
		t.Fatalf("task decided %d times", row.Recoveries)
	}
}

// A recoverer keeps working when DB1 (its lock) and DB2 are unreachable:
// the lease alone guards, and the verdict is drawn without DB2.
func TestRecoveryWithoutRedis(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	f.drain()
	id := f.send(false)
	f.age(id)
	dead, err := rds.NewRedis("redis://127.0.0.1:1/1", rds.RedisConfig{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	deadStub, err := legacystub.New(legacystub.Config{RedisTimeout: 200 * time.Millisecond}, legacystub.Deps{DB2: dead, Store: f.store})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := deadStub.NewRecoverer(dead, "inst-x").RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("recovery without Redis: %d %v", n, err)
	}
	if row := f.task(id); row.State != store.StubDone || row.Recoveries != 1 {
		t.Fatalf("task: %+v", row)
	}
	// A poll of a pending task needs DB2: it fails as Redis unavailable.
	id2 := f.send(false)
	if _, err := deadStub.Poll(ctx, id2); !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("poll with DB2 down: %v", err)
	}
}

// With DB1 and DB2 stalled (not refusing: a paused or swapping host, each
// call waiting the full RedisTimeout), a round of stuck tasks still ends
// well inside the recovery budget: DB2 is read once for the batch and DB1
// is given up after its first timeout, and every task is decided once.
func TestRecoveryWithStalledRedisStaysWithinTheBudget(t *testing.T) {
	ctx := context.Background()
	cfg := legacystub.Config{PollInterval: 100 * time.Millisecond, MaxPolls: 30, RecoveryBudget: 10 * time.Second,
		RecoveryInterval: time.Second, RecoveryLease: 2 * time.Second, RedisTimeout: time.Second}
	f := newFixture(t, cfg)
	f.drain()
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = f.send(false)
	}
	f.age(ids...)

	srv1, db1 := testenv.StallableRedis(t, 1, cfg.RedisTimeout)
	srv2, db2 := testenv.StallableRedis(t, 2, cfg.RedisTimeout)
	stalled, err := legacystub.New(cfg, legacystub.Deps{DB2: db2, Store: f.store})
	if err != nil {
		t.Fatal(err)
	}
	srv1.Freeze(t)
	srv2.Freeze(t)
	start := time.Now()
	n, err := stalled.NewRecoverer(db1, "stalled-redis").RunOnce(ctx)
	took := time.Since(start)
	// Tasks an earlier test of the package left running may come due
	// during this one and be recovered in the same round: at least this
	// test's own, each checked below.
	if err != nil || n < len(ids) {
		t.Fatalf("recovery with Redis stalled: %d %v, want at least this test's %d", n, err, len(ids))
	}
	// The budget a round has: a stuck task waits at most one interval to
	// be picked up.
	if budget := cfg.RecoveryBudget - cfg.RecoveryInterval; took >= budget {
		t.Fatalf("with Redis stalled one round of %d stuck tasks took %s, more than the recovery budget leaves (%s)",
			len(ids), took.Round(100*time.Millisecond), budget)
	}
	for _, id := range ids {
		if row := f.task(id); row.State != store.StubDone || row.DecidedBy != store.DecidedByRecovery || row.Recoveries != 1 {
			t.Fatalf("task %s: %+v", id, row)
		}
	}
}

// Start and Close of the background loop: a round runs on the timer and
// Close waits for it.
func TestRecovererLoop(t *testing.T) {
	f := newFixture(t, legacystub.Config{RecoveryInterval: 20 * time.Millisecond})
	f.drain()
	id := f.send(true)
	f.age(id)
	r := f.stub.NewRecoverer(f.db1, "loop")
	r.Start()
	defer r.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return f.task(id).State == store.StubDone },
		"the loop did not recover the stuck task")
	r.Close()
	r.Close()
}

// The PostgreSQL guard itself, without the rest of a round: owners racing
// to claim a stuck task get it exactly once, only the holder can decide, and
// a decided task can be claimed by nobody.
func TestLeaseAdmitsOneOwner(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	f.drain()
	claims := func(owner, id string) bool {
		got, err := f.store.ClaimStuckStubTasks(ctx, time.Minute, owner, time.Minute, 100)
		if err != nil {
			t.Error(err)
		}
		return slices.Contains(got, id)
	}
	for round := 0; round < 5; round++ {
		id := f.send(false)
		f.age(id)
		var wg sync.WaitGroup
		won := make([]bool, 8)
		for i := range won {
			wg.Add(1)
			go func() {
				defer wg.Done()
				won[i] = claims(fmt.Sprintf("owner-%d", i), id)
			}()
		}
		wg.Wait()
		winner := -1
		for i, ok := range won {
			if ok {
				if winner >= 0 {
					t.Fatalf("round %d: owners %d and %d both hold the lease", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody got the lease", round)
		}
		loser := fmt.Sprintf("owner-%d", (winner+1)%len(won))
		if ok, err := f.store.FinishStubRecovery(ctx, id, loser, store.VerdictApproved); err != nil || ok {
			t.Fatalf("a non-holder decided the task: %v %v", ok, err)
		}
		if ok, err := f.store.FinishStubRecovery(ctx, id, fmt.Sprintf("owner-%d", winner), store.VerdictRejected); err != nil || !ok {
			t.Fatalf("the holder could not decide: %v %v", ok, err)
		}
		if claims("late", id) {
			t.Fatal("a decided task was claimed")
		}
		if row := f.task(id); row.Verdict != store.VerdictRejected || row.Recoveries != 1 {
			t.Fatalf("task: %+v", row)
		}
	}
}

type tunables map[string]int

func (t tunables) Int(name string, def int) int {
	if v, ok := t[name]; ok {
		return v
	}
	return def
}

// legacy_stub.verdict_after_polls (a runtime setting) overrides the poll
// that decides, within 1..max polls.
func TestVerdictAfterPollsTunable(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	tun := tunables{legacystub.TunableVerdictAfterPolls: 1}
	stub, err := legacystub.New(legacystub.Config{}, legacystub.Deps{DB2: f.db2, Store: f.store, Tunables: tun})
	if err != nil {
		t.Fatal(err)
	}
	id := f.send(true)
	if v, err := stub.Poll(ctx, id); err != nil || v == legacystub.SafetyPending {
		t.Fatalf("the first poll must decide with the tunable at 1: %q %v", v, err)
	}
	tun[legacystub.TunableVerdictAfterPolls] = 99 // above max polls: ignored, the configured 3 applies
	id = f.send(true)
	for i := 1; i <= 3; i++ {
		v, err := stub.Poll(ctx, id)
		if err != nil || (i < 3) != (v == legacystub.SafetyPending) {
			t.Fatalf("poll %d: %q %v", i, v, err)
		}
	}
}
