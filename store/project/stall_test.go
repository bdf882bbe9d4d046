package project_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
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
