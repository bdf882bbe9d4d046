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
	rs, rdb := testenv.StallableRedis(t, 0, 200*time.Millisecond)
	admin := rs.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	const capBytes = 64 << 10
	e := &leaseEnv{t: t, rdb: rdb, admin: admin, env: "stall" + ids.New()[24:], cap: capBytes}
	e.mk = project.NewModuleKeys(e.env)
	q := e.queue(project.QueueConfig{ModuleLeaseBytes: 16 << 10})
	tp := e.topic(q)
	// The scripts are loaded and the lease taken: the stalled publish is
	// the only call it makes.
	if err := publishOne(q, tp, "warm"); err != nil {
		t.Fatal(err)
	}

	thaw := rs.Freeze(t)
	if err := publishOne(q, tp, "stalled"); err == nil {
		t.Fatal("a publish against a stopped Redis succeeded")
	}
	thaw()
	ctx := context.Background()
	testenv.Eventually(t, 5*time.Second, func() bool { return admin.XLen(ctx, tp.k.TopicStream(tp.tid)).Val() == 2 },
		"the stalled publish never ran: the test does not show what it means to")

	n := 0
	for ; ; n++ {
		err := publishOne(q, tp, fmt.Sprint("fill-", n))
		if errors.Is(err, project.ErrBudgetExhausted) {
			break
		}
		if err != nil {
			t.Fatalf("publish %d: %v", n, err)
		}
	}
	if sum := e.projectBytes(tp); sum > capBytes {
		t.Fatalf("the project holds %d bytes after %d more publishes: past the module's cap of %d", sum, n, capBytes)
	}
}
