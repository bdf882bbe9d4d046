package project_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// budgetEnv is one isolated module budget (its own HAN_ENV) with one
// project whose budget counters the test sets as a project script would.
type budgetEnv struct {
	t       *testing.T
	rdb     redis.UniversalClient
	admin   *redis.Client
	mb      *project.ModuleBudget
	mk      project.ModuleKeys
	env     string
	project project.Keys
	pid     string
}

func newBudgetEnv(t *testing.T) *budgetEnv {
	t.Helper()
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	admin := env.Redis.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	e := "mb" + ids.New()[24:]
	pid := ids.New()
	return &budgetEnv{t: t, rdb: rdb, admin: admin, mb: project.NewModuleBudget(rdb, e, 1<<20), mk: project.NewModuleKeys(e), env: e,
		project: project.NewKeys(e, pid), pid: pid}
}

// projectBytes sets the project's reliable bytes (what its scripts keep).
func (e *budgetEnv) projectBytes(n int64) {
	e.t.Helper()
	if err := e.admin.HSet(context.Background(), e.project.Budget(), "msg", n, "rcpt", 0, "dd", 0).Err(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *budgetEnv) committed() int64 {
	e.t.Helper()
	u, err := e.mb.Usage(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return u.Committed
}

// The reconcile generation keeps a release that a reconcile may already
// have counted from being subtracted twice (which would under-count and
// over-admit), and a write committed while a reconcile scans is kept.
func TestModuleBudgetProtocolAroundReconcile(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	r, ok, err := e.mb.Reserve(ctx, e.pid, 1000)
	if err != nil || !ok {
		t.Fatalf("reserve: %v %v", ok, err)
	}
	e.projectBytes(1000)
	if err := e.mb.Settle(ctx, r, 1000, 0); err != nil || e.committed() != 1000 {
		t.Fatalf("settle: %v, committed %d", err, e.committed())
	}

	// A release whose project script ran before a whole reconcile: the
	// reconcile counted it, the late settle must not subtract it again.
	g0, err := e.mb.Gen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.projectBytes(600)
	if res, err := e.mb.Reconcile(ctx, time.Hour); err != nil || !res.Ran || res.After != 600 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	if err := e.mb.Settle(ctx, project.Reservation{Gen: g0}, 0, 400); err != nil || e.committed() != 600 {
		t.Fatalf("late release: %v, committed %d, want 600", err, e.committed())
	}
	// The same release without a reconcile in between is applied.
	g1, _ := e.mb.Gen(ctx)
	e.projectBytes(500)
	if err := e.mb.Settle(ctx, project.Reservation{Gen: g1}, 0, 100); err != nil || e.committed() != 500 {
		t.Fatalf("release: %v, committed %d, want 500", err, e.committed())
	}

	// A write settled while the reconcile scans is counted by its end.
	keys := []string{e.mk.Budget(), e.mk.Reservations(), e.mk.Leases(), e.mk.Projects(), e.mk.Seen()}
	begin, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "begin", time.Hour.Milliseconds(), time.Minute.Milliseconds()).Int64Slice()
	if err != nil || begin[0] != 1 {
		t.Fatalf("begin: %v %v", begin, err)
	}
	scanned := int64(500) // the scan read the project before the write
	// A second reconcile steps aside while this one runs.
	if res, err := e.mb.Reconcile(ctx, time.Hour); err != nil || res.Ran {
		t.Fatalf("concurrent reconcile: %+v %v", res, err)
	}
	r, ok, err = e.mb.Reserve(ctx, e.pid, 300)
	if err != nil || !ok {
		t.Fatal(err)
	}
	e.projectBytes(800)
	if err := e.mb.Settle(ctx, r, 300, 0); err != nil {
		t.Fatal(err)
	}
	end, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "end", begin[1], scanned).Int64Slice()
	if err != nil || end[0] != 1 || end[2] != 800 {
		t.Fatalf("end: %v %v", end, err)
	}
	if e.committed() != 800 {
		t.Fatalf("committed %d, want 800", e.committed())
	}
	// The cap is enforced on committed + reserved.
	if _, ok, err := e.mb.Reserve(ctx, e.pid, 1<<20-800+1); err != nil || ok {
		t.Fatalf("reservation past the cap granted (%v)", err)
	}
	if _, ok, err := e.mb.Reserve(ctx, e.pid, 1<<20-800); err != nil || !ok {
		t.Fatalf("reservation up to the cap refused (%v)", err)
	}
}

func TestBudgetReconcilerRunsPeriodically(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	r, _, _ := e.mb.Reserve(ctx, e.pid, 100)
	e.projectBytes(100)
	_ = e.mb.Settle(ctx, r, 100, 0)
	// Leaked bytes: a writer died between its project script and settle.
	e.admin.HIncrBy(ctx, e.mk.Budget(), "committed", 5000)
	rc := project.NewBudgetReconciler(e.mb, project.BudgetReconcilerConfig{Interval: 20 * time.Millisecond}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	rc.Start()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.committed() == 100 }, "not reconciled: %d", e.committed())
	rc.Close()
	rc.Close()
}

// Between a reconcile's begin and its end (and when its end never comes: a
// failed scan) the module budget counts no less than the projects hold: the
// bytes of a dropped reservation whose project script ran, and of an
// expired lease the instance used, move to committed instead of leaving
// the count. A reservation past the cap is refused meanwhile.
func TestModuleBudgetNeverUnderCountsBetweenReconcilePhases(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	if _, ok, err := e.mb.Reserve(ctx, e.pid, 1<<20); err != nil || !ok {
		t.Fatalf("reserve the whole cap: %v %v", ok, err)
	}
	e.projectBytes(1 << 20) // the project script ran; the writer died before settling
	keys := []string{e.mk.Budget(), e.mk.Reservations(), e.mk.Leases(), e.mk.Projects(), e.mk.Seen()}
	begin, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "begin", int64(-1), time.Minute.Milliseconds()).Int64Slice()
	if err != nil || begin[0] != 1 || begin[2] != 1 {
		t.Fatalf("begin: %v %v, want the stale reservation dropped", begin, err)
	}
	if got := e.committed(); got != 1<<20 {
		t.Fatalf("committed after begin %d, want the dropped reservation's %d", got, 1<<20)
	}
	if _, ok, err := e.mb.Reserve(ctx, e.pid, 1); err != nil || ok {
		t.Fatalf("a reservation past the cap granted between the phases (%v)", err)
	}
	end, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "end", begin[1], int64(1<<20)).Int64Slice()
	if err != nil || end[0] != 1 || end[2] != 1<<20 {
		t.Fatalf("end: %v %v", end, err)
	}
}

// A project whose budget the reconcile cannot read (a counter negative or
// not a number, or a key of another type) does not stop the reconcile of
// every other project: that one used to fail the run before its end, so
// the window stayed open and the module counter was never brought back
// down. The run skips it and reports its id. Its bytes are unknown, so it
// counts as a whole project budget, and the counter is never raised on its
// account: an exact counter stays, an over-count comes down to the other
// projects' bytes plus that allowance.
func TestModuleBudgetReconcileSkipsUnreadableProjects(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	e.projectBytes(100)
	bad := []string{ids.New(), ids.New(), ids.New()}
	e.admin.HSet(ctx, project.NewKeys(e.env, bad[0]).Budget(), "msg", "-5")
	e.admin.HSet(ctx, project.NewKeys(e.env, bad[1]).Budget(), "rcpt", "not-a-number")
	e.admin.Set(ctx, project.NewKeys(e.env, bad[2]).Budget(), "a string", 0)
	e.admin.SAdd(ctx, e.mk.Projects(), e.pid, bad[0], bad[1], bad[2])
	e.admin.HSet(ctx, e.mk.Budget(), "committed", 100)

	res, err := e.mb.Reconcile(ctx, time.Hour)
	if err != nil || !res.Ran || res.Projects != 1 || res.Unreadable != 3 {
		t.Fatalf("reconcile: %+v %v; want it to run, sum the readable project and skip the 3 others", res, err)
	}
	if got := slices.Sorted(slices.Values(res.UnreadableIDs)); !slices.Equal(got, slices.Sorted(slices.Values(bad))) {
		t.Fatalf("unreadable projects reported %v, want %v", got, bad)
	}
	if got := e.committed(); got != 100 {
		t.Fatalf("committed %d after the reconcile, want the exact 100 kept (never raised for unreadable projects)", got)
	}

	// An over-count (writers that died between their phases) comes down,
	// and the window closed: the next run is not refused.
	e.admin.HIncrBy(ctx, e.mk.Budget(), "committed", 64<<20)
	var logs testenv.LogBuffer
	rc := project.NewBudgetReconciler(e.mb, project.BudgetReconcilerConfig{Interval: 20 * time.Millisecond}, slog.New(slog.NewJSONHandler(&logs, nil)))
	rc.Start()
	want := 100 + 3*int64(project.ProjectBudgetBytes)
	testenv.Eventually(t, 5*time.Second, func() bool { return e.committed() == want }, "committed %d, want %d", e.committed(), want)
	rc.Close()
	for _, id := range bad {
		if !strings.Contains(logs.String(), id) {
			t.Fatalf("the reconcile's log does not name unreadable project %s: %s", id, logs.String())
		}
	}
	if strings.Contains(logs.String(), "not-a-number") {
		t.Fatalf("the reconcile's log holds a value it found: %s", logs.String())
	}
}
