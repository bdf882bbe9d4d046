package project_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/project"
)

// ageStamps moves the projects' last reservation or lease call back past
// any grace, instead of waiting for it.
func ageStamps(t *testing.T, e *budgetEnv, pids ...string) {
	t.Helper()
	old := fmt.Sprint(time.Now().Add(-24 * time.Hour).UnixMilli())
	for _, pid := range pids {
		if err := e.admin.HSet(context.Background(), e.mk.Seen(), pid, old).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *budgetEnv) member(pid string) bool {
	e.t.Helper()
	ok, err := e.admin.SIsMember(context.Background(), e.mk.Projects(), pid).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// reserveNothingKept is a write of pid that reserved and whose project
// script kept nothing.
func (e *budgetEnv) reserveNothingKept(pid string) {
	e.t.Helper()
	ctx := context.Background()
	r, ok, err := e.mb.Reserve(ctx, pid, 100)
	if err != nil || !ok {
		e.t.Fatalf("reserve: %v %v", ok, err)
	}
	if err := e.mb.Settle(ctx, r, 0, 0); err != nil {
		e.t.Fatal(err)
	}
}

// The reconcile reads the budget of every project in the module's
// projects SET. A project that holds nothing any more (its budget key is
// gone, or every counter is 0) and that no reservation or lease has named
// for the grace leaves the SET, so the SET and every reconcile's reads
// do not grow with every project that ever wrote. A project that holds
// bytes, or that wrote within the grace, stays; one that leaves comes
// back with its next reservation, and its bytes are summed again.
func TestReconcileDropsProjectsThatHoldNothing(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	gone, zero, fresh := ids.New(), ids.New(), ids.New()
	for _, pid := range []string{e.pid, gone, zero, fresh} {
		e.reserveNothingKept(pid)
	}
	e.projectBytes(700) // e.pid holds bytes
	if err := e.admin.HSet(ctx, project.NewKeys(e.env, zero).Budget(), "msg", 0, "rcpt", 0, "dd", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ageStamps(t, e, e.pid, gone, zero) // fresh wrote just now

	res, err := e.mb.Reconcile(ctx, time.Minute)
	if err != nil || !res.Ran || res.After != 700 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	for pid, want := range map[string]bool{e.pid: true, gone: false, zero: false, fresh: true} {
		if got := e.member(pid); got != want {
			t.Errorf("project %s in the projects SET: %v, want %v", pid, got, want)
		}
	}
	if n := e.admin.HLen(ctx, e.mk.Seen()).Val(); n != 2 {
		t.Errorf("%d stamps left, want 2 (the members')", n)
	}

	// The next reservation brings the project back, and its bytes are summed.
	r, ok, err := e.mb.Reserve(ctx, gone, 300)
	if err != nil || !ok || !e.member(gone) {
		t.Fatalf("reserve after the prune: %v %v, member %v", ok, err, e.member(gone))
	}
	if err := e.admin.HSet(ctx, project.NewKeys(e.env, gone).Budget(), "msg", 300).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.mb.Settle(ctx, r, 300, 0); err != nil {
		t.Fatal(err)
	}
	ageStamps(t, e, gone)
	if res, err := e.mb.Reconcile(ctx, time.Minute); err != nil || !res.Ran || res.After != 1000 || !e.member(gone) {
		t.Fatalf("reconcile: %+v %v, member %v; want 1000 summed and the project kept", res, err, e.member(gone))
	}
}

// A reservation that lands while the reconcile scans, after the scan read
// the project empty, keeps the project in the SET: the drop and the check
// of the project's last reservation are one script, and the reservation
// stamps the project in the same script that adds it. So the bytes the
// write then keeps are summed by the next reconcile.
func TestReconcileKeepsAProjectReservedDuringItsScan(t *testing.T) {
	e := newBudgetEnv(t)
	ctx := context.Background()
	e.reserveNothingKept(e.pid)
	ageStamps(t, e, e.pid)
	keys := []string{e.mk.Budget(), e.mk.Reservations(), e.mk.Leases(), e.mk.Projects(), e.mk.Seen()}
	begin, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "begin", time.Minute.Milliseconds(), time.Minute.Milliseconds()).Int64Slice()
	if err != nil || begin[0] != 1 {
		t.Fatalf("begin: %v %v", begin, err)
	}
	// The scan has read the project's budget: empty. A write reserves now.
	r, ok, err := e.mb.Reserve(ctx, e.pid, 500)
	if err != nil || !ok {
		t.Fatalf("reserve: %v %v", ok, err)
	}
	pr, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "prune", begin[1], time.Minute.Milliseconds(), e.pid).Int64Slice()
	if err != nil || len(pr) != 2 || pr[0] != 1 || pr[1] != 0 || !e.member(e.pid) {
		t.Fatalf("prune: %v %v, member %v; want the project kept", pr, err, e.member(e.pid))
	}
	e.projectBytes(500)
	if err := e.mb.Settle(ctx, r, 500, 0); err != nil {
		t.Fatal(err)
	}
	end, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "end", begin[1], 0, 0).Int64Slice()
	if err != nil || end[0] != 1 || end[2] != 500 {
		t.Fatalf("end: %v %v", end, err)
	}
	if res, err := e.mb.Reconcile(ctx, time.Minute); err != nil || res.After != 500 {
		t.Fatalf("next reconcile: %+v %v, want the project's 500 bytes summed", res, err)
	}
	// A prune from a window that is no longer the current one drops nothing.
	ageStamps(t, e, e.pid)
	e.projectBytes(0)
	if pr, err := lua.ProjectTopicBudgetReconcile.Run(ctx, e.rdb, keys, "prune", begin[1], 0, e.pid).Int64Slice(); err != nil ||
		pr[0] != 0 || !e.member(e.pid) {
		t.Fatalf("stale prune: %v %v, member %v", pr, err, e.member(e.pid))
	}
}

// An instance draws on its lease only for the projects the call that
// granted the lease named (and stamped): those it drew for within the
// last lease's use (5 s). A project it published for before, dropped
// since by the reconcile because it held nothing, is named again by a
// lease call before its next publish draws a byte, so the reconcile sums
// what that publish keeps. Here the project's keys are deleted (an
// operator removing a project's data): it holds nothing and leaves the
// SET.
func TestLeasedPublishAfterThePruneIsSummed(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	q := e.queue(project.QueueConfig{})
	ctx := context.Background()
	a, b := e.topic(q), e.topic(q)
	if err := publishOne(q, a, "a0"); err != nil {
		t.Fatal(err)
	}
	stamp := func(pid string) int64 {
		n, _ := e.admin.HGet(ctx, e.mk.Seen(), pid).Int64()
		return n
	}
	// b publishes on, a no more: a lease call more than a lease's use
	// after a's last draw names b without a (a call that names both stamps
	// both with the same time).
	n := 0
	testenv.Eventually(t, 20*time.Second, func() bool {
		n++
		if err := publishOne(q, b, fmt.Sprint("b", n)); err != nil {
			t.Fatal(err)
		}
		return stamp(b.pid) > stamp(a.pid)
	}, "no lease call after a's draws aged out")
	var cursor uint64
	for {
		keys, next, err := e.admin.Scan(ctx, cursor, a.k.Prefix()+"*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			e.admin.Del(ctx, keys...)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	// The grace passes (a's stamp moved back instead of waiting for it).
	e.admin.HSet(ctx, e.mk.Seen(), a.pid, time.Now().Add(-24*time.Hour).UnixMilli())
	mb := project.NewModuleBudget(e.rdb, e.env, e.cap)
	if res, err := mb.Reconcile(ctx, time.Minute); err != nil || !res.Ran {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	if e.admin.SIsMember(ctx, e.mk.Projects(), a.pid).Val() || !e.admin.SIsMember(ctx, e.mk.Projects(), b.pid).Val() {
		t.Fatal("want the emptied project out of the projects SET and the other one in")
	}
	// The project is used again, through the same instance.
	a2 := a
	top, err := q.CreateTopic(ctx, a.k, ids.New(), "t2", "")
	if err != nil {
		t.Fatal(err)
	}
	a2.tid = top.ID
	if err := publishOne(q, a2, "a1"); err != nil {
		t.Fatal(err)
	}
	if !e.admin.SIsMember(ctx, e.mk.Projects(), a.pid).Val() {
		t.Fatal("a publish drew bytes for a project outside the projects SET: the reconcile will not sum them")
	}
}
