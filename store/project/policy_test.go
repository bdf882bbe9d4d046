package project_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// When Redis stalls after the cached eviction policy has gone stale, the
// writes that check the gate at once all fail within the time of one INFO
// (the client's timeout, twice with its one retry): one of them reads INFO,
// the others wait for that read and share its failure. They used to queue on the gate's lock and each read INFO in
// turn, so the n-th answered only after n timeouts. Once Redis is back (and
// the remembered failure has lapsed) writes pass the gate again.
func TestStalledEvictionGateFailsItsWaitersTogether(t *testing.T) {
	const timeout = 300 * time.Millisecond
	rs, rdb := testenv.StallableRedis(t, 0, timeout)
	gate := project.NewEvictionGate(rdb, 50*time.Millisecond)
	if err := gate.CheckWrite(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the cached policy goes stale
	thaw := rs.Freeze(t)
	defer thaw()
	const n = 6
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			errs[i] = gate.CheckWrite(context.Background())
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	thaw()
	for i, err := range errs {
		if !errors.Is(err, rds.ErrRedisUnavailable) {
			t.Fatalf("write gate %d against a stalled Redis: %v, want redis unavailable", i, err)
		}
	}
	if worst := slices.Max(took); worst > 3*timeout {
		t.Fatalf("the slowest of %d write gates against a stalled Redis failed after %v (fastest %v); client timeout %v",
			n, worst, slices.Min(took), timeout)
	}
	testenv.Eventually(t, 3*time.Second, func() bool { return gate.CheckWrite(context.Background()) == nil },
		"the write gate never passed again after Redis came back")
}

// A caller waiting for the gate's policy leaves when its own context ends,
// even while another caller's INFO is still waiting for a stalled Redis
// (with the client's longer timeout): a request's budget bounds its wait
// for the gate, as it bounds its own Redis calls.
func TestEvictionGateWaitEndsWithTheCallersContext(t *testing.T) {
	const timeout, budget = 600 * time.Millisecond, 100 * time.Millisecond
	rs, rdb := testenv.StallableRedis(t, 0, timeout)
	gate := project.NewEvictionGate(rdb, 50*time.Millisecond)
	if err := gate.CheckWrite(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the cached policy goes stale
	thaw := rs.Freeze(t)
	defer thaw()
	first := make(chan error, 1)
	go func() { first <- gate.CheckWrite(context.Background()) }()
	time.Sleep(50 * time.Millisecond) // the first caller's INFO is under way
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	err := gate.CheckWrite(ctx)
	took := time.Since(start)
	if !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("a write gate whose budget ran out: %v, want redis unavailable", err)
	}
	if took > timeout/2 {
		t.Fatalf("a write gate with a budget of %v waited %v behind another caller's INFO (client timeout %v)", budget, took, timeout)
	}
	if err := <-first; !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("the first write gate against a stalled Redis: %v, want redis unavailable", err)
	}
}
