package legacystub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
)

// More tasks become stuck at once than one round claims (every sent message
// is a task, and a client that never polls leaves it to recovery): the
// recoverer keeps running rounds within a tick, so every one of them is
// still decided inside the recovery budget. With one round of 100 tasks per
// interval, 350 tasks would need four intervals, more than the budget holds.
func TestRecoveryClearsABacklogWithinTheBudget(t *testing.T) {
	cfg := legacystub.Config{PollInterval: 10 * time.Millisecond, MaxPolls: 3, RecoveryBudget: 3 * time.Second,
		RecoveryInterval: time.Second, RecoveryLease: time.Second}
	f := newFixture(t, cfg)
	f.drain()
	ids := make([]string, 350)
	for i := range ids {
		ids[i] = f.send(true) // in DB2 too; the client just never polls
	}
	f.age(ids...) // all stuck now
	stuckAt := time.Now()
	r := f.stub.NewRecoverer(f.db1, "inst-a")
	r.Start()
	defer r.Close()
	pending := func() int {
		var n int
		if err := f.pool.QueryRow(context.Background(),
			"SELECT count(*) FROM stub_tasks WHERE state='pending' AND message_id = ANY($1::uuid[])", ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, time.Until(stuckAt.Add(cfg.RecoveryBudget)), func() bool { return pending() == 0 },
		"stuck tasks still pending after the recovery budget")
	for _, id := range ids {
		if row := f.task(id); row.Recoveries != 1 {
			t.Fatalf("task %s decided %d times", id, row.Recoveries)
		}
	}
}

// Two recoverers whose rounds overlap claim different tasks instead of both
// listing the same oldest batch: while A works on the batch it claimed, B's
// round takes the tasks after it, so between them the two rounds decide
// 150 stuck tasks, more than one batch, each exactly once.
func TestConcurrentRoundsClaimDifferentTasks(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, legacystub.Config{})
	f.drain()
	ids := make([]string, 150)
	for i := range ids {
		ids[i] = f.send(false)
	}
	f.age(ids...)
	a, b := f.stub.NewRecoverer(f.db1, "inst-a"), f.stub.NewRecoverer(f.db1, "inst-b")
	inRound, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	legacystub.SetAfterLease(a, func(string) {
		once.Do(func() {
			close(inRound)
			<-resume
		})
	})
	aDone := make(chan int, 1)
	go func() {
		n, err := a.RunOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		aDone <- n
	}()
	<-inRound // A holds its first task's lease, the rest of its batch waits
	nb, err := b.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	close(resume)
	if na := <-aDone; na+nb != len(ids) {
		t.Fatalf("overlapping rounds decided %d + %d of %d tasks", na, nb, len(ids))
	}
	for _, id := range ids {
		if row := f.task(id); row.State != store.StubDone || row.Recoveries != 1 {
			t.Fatalf("task %s: %+v", id, row)
		}
	}
}
