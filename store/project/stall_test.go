package project_test

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
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// The module budget is never passed, even when a publish got no reply: a
// Redis that stalls instead of failing runs the publish it had received
// when it wakes, and the message and its bytes are then kept. Giving the
// publish's share of the lease back because the caller saw an error would
// let later publishes take those bytes again and fill the module past its
// cap; they stay counted instead (an over-count the reconcile corrects).
func TestStalledPublishStaysCountedOnTheModule(t *testing.T) {
	rs, e, q, tp := stalledModule(t, 200*time.Millisecond)
	admin := e.admin
	thaw := rs.Freeze(t)
	if err := publishOne(q, tp, "stalled"); err == nil {
		t.Fatal("a publish against a stopped Redis succeeded")
	}
	thaw()
	ctx := context.Background()
	testenv.Eventually(t, 5*time.Second, func() bool { return admin.XLen(ctx, tp.k.TopicStream(tp.tid)).Val() == 2 },
		"the stalled publish never ran: the test does not show what it means to")

	if n, sum := fillModule(t, e, q, tp); sum > stalledModuleCap {
		t.Fatalf("the project holds %d bytes after %d more publishes: past the module's cap of %d", sum, n, stalledModuleCap)
	}
}

// stalledModuleCap is the module cap of stalledModule.
const stalledModuleCap = 64 << 10

// stalledModule is a queue on a Redis of the test's own, a module capped at
// stalledModuleCap drawn on through 16 KiB leases, and a topic with one
// message published: the scripts are loaded and the lease taken, so a
// publish stalled next makes no other call.
func stalledModule(t *testing.T, budget time.Duration) (*testenv.RedisServer, *leaseEnv, *project.Queue, leaseTopic) {
	t.Helper()
	rs, e, q, tp := stalledQueue(t, budget, stalledModuleCap, project.QueueConfig{ModuleLeaseBytes: 16 << 10})
	if err := publishOne(q, tp, "warm"); err != nil {
		t.Fatal(err)
	}
	return rs, e, q, tp
}

// stalledQueue is a queue of cfg on a Redis of the test's own whose client
// gives up after budget, a module capped at capBytes, and a topic with a
// subscription.
func stalledQueue(t *testing.T, budget time.Duration, capBytes int64, cfg project.QueueConfig) (*testenv.RedisServer, *leaseEnv, *project.Queue, leaseTopic) {
	t.Helper()
	rs, rdb := testenv.StallableRedis(t, 0, budget)
	admin := rs.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	e := &leaseEnv{t: t, rdb: rdb, admin: admin, env: "stall" + ids.New()[24:], cap: capBytes}
	e.mk = project.NewModuleKeys(e.env)
	q := e.queue(cfg)
	return rs, e, q, e.topic(q)
}

// fillModule publishes until the module's budget refuses one and returns
// how many went out and what the project holds then.
func fillModule(t *testing.T, e *leaseEnv, q *project.Queue, tp leaseTopic) (n int, sum int64) {
	t.Helper()
	for ; ; n++ {
		err := publishOne(q, tp, fmt.Sprint("fill-", n))
		if errors.Is(err, project.ErrBudgetExhausted) {
			break
		}
		if err != nil {
			t.Fatalf("publish %d: %v", n, err)
		}
	}
	return n, e.projectBytes(tp)
}

// When Redis stalls, the publishes that need a new module lease (here the
// first ones of a project this instance has not drawn on a lease for) all
// fail within about one client timeout. One of them renews; the others
// wait for it and share its failure instead of renewing again one after
// another: the n-th of them used to answer only after n timeouts. Once
// Redis is back, publishes succeed again.
func TestStalledLeaseRenewalFailsItsWaitersTogether(t *testing.T) {
	const timeout = 300 * time.Millisecond
	took := stalledRenewals(t, timeout, project.QueueConfig{ModuleLeaseBytes: 16 << 10})
	if worst := slices.Max(took); worst > 2*timeout {
		t.Fatalf("the slowest of %d publishes waiting for a lease against a stalled Redis failed after %v (fastest %v); client timeout %v",
			len(took), worst, slices.Min(took), timeout)
	}
}

// No publish waits for a lease longer than the queue's Redis budget, even
// when the client's own timeout is longer: neither the one that renews nor
// those that wait for it.
func TestStalledLeaseRenewalEndsWithinTheRedisBudget(t *testing.T) {
	const timeout, budget = 2 * time.Second, 200 * time.Millisecond
	took := stalledRenewals(t, timeout, project.QueueConfig{ModuleLeaseBytes: 16 << 10, RedisBudget: budget})
	if worst := slices.Max(took); worst > timeout/2 {
		t.Fatalf("the slowest of %d publishes waiting for a lease against a stalled Redis failed after %v (fastest %v); Redis budget %v, client timeout %v",
			len(took), worst, slices.Min(took), budget, timeout)
	}
}

// stalledRenewals publishes at once, against a stalled Redis whose client
// gives up after timeout, the first messages of a project new to a queue
// of cfg that holds a lease: each needs a lease renewal. It checks they
// all fail with redis unavailable, that a publish succeeds once Redis is
// back, and returns how long each took to fail.
func stalledRenewals(t *testing.T, timeout time.Duration, cfg project.QueueConfig) []time.Duration {
	t.Helper()
	rs, e, q, warm := stalledQueue(t, timeout, 64<<20, cfg)
	if err := publishOne(q, warm, "warm"); err != nil {
		t.Fatal(err)
	}
	tp := e.topic(q)
	// The trim reads the topic's subscriptions, which the instance keeps:
	// the publishes below make no Redis call before they ask for a lease.
	if _, err := q.Trim(context.Background(), tp.k, tp.pid, tp.tid); err != nil {
		t.Fatal(err)
	}
	thaw := rs.Freeze(t)
	defer thaw()
	const n = 8
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			errs[i] = publishOne(q, tp, fmt.Sprint("stalled-", i))
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	thaw()
	for i, err := range errs {
		if !errors.Is(err, rds.ErrRedisUnavailable) {
			t.Fatalf("publish %d against a stalled Redis: %v, want redis unavailable", i, err)
		}
	}
	testenv.Eventually(t, 3*time.Second, func() bool { return publishOne(q, tp, "after") == nil },
		"no publish succeeded after Redis came back")
	return took
}
