package clustertest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// One master stalls (stopped, before any failover) under an idempotency
// reserve of its own, which gets no reply: its owner token is abandoned,
// to be given up once the master answers. Reserves, completions and
// releases whose keys live on the healthy masters go on as before, each
// answered by its own master: the stalled master's timeouts (a reserve's,
// a DB0 check's PING that reached it) must not mark DB0 down for them (503
// for every idempotent request until a probe happened to reach a healthy
// master). Once the master wakes, a retry with
// the stalled request's key gets the lock, and the abandoned token was
// given up once.
func TestIdempotencyPastAStalledMaster(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
	health := rds.NewRedisHealth(rdb, rds.HealthConfig{}, nil)
	t.Cleanup(health.Close)
	var mu sync.Mutex
	abandoned := map[string]int{}
	idem := store.NewIdempotency(rdb, health, store.IdempotencyConfig{OnAbandon: func(outcome string, n int) {
		mu.Lock()
		defer mu.Unlock()
		abandoned[outcome] += n
	}})
	t.Cleanup(idem.Close)

	victim := c.Nodes[0]
	var stalled store.IdemKey
	var healthy []store.IdemKey
	for n := 3000; stalled.UserID == "" || len(healthy) < 12; n++ {
		k := place{n: n}.idem()
		m, err := c.MasterOf(ctx, k.RecordKey())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m != victim && len(healthy) < 12:
			healthy = append(healthy, k)
		case m == victim && stalled.UserID == "":
			stalled = k
		}
	}
	rec := store.IdemRecord{Fingerprint: "fp", Status: 201, ResourceID: "res", Version: 1, Meta: "{}"}
	for _, k := range []store.IdemKey{stalled, healthy[0]} { // load the scripts, open the connections
		if r, err := idem.Reserve(ctx, k, "fp", "warm"); err != nil || r.Outcome != store.IdemAcquired {
			t.Fatalf("reserve before the stall: %+v %v", r, err)
		}
		if n, err := idem.Release(ctx, k, "warm"); err != nil || n != 1 {
			t.Fatalf("release before the stall: %d %v", n, err)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := idem.Reserve(rctx, stalled, "fp", "stalled-owner")
	cancel()
	if err == nil {
		t.Fatal("a reserve on the stalled master was answered")
	}
	// A request path with no script of its own checks DB0 with a PING,
	// which a cluster client sends to a master picked at random: one that
	// reaches the stalled master fails, and is that master's failure too.
	pinged := false
	for range 40 {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := health.Ping(rctx)
		cancel()
		if pinged = err != nil; pinged {
			break
		}
	}
	if !pinged {
		t.Fatal("no PING of 40 reached the stalled master")
	}
	for i, k := range healthy {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := idem.Reserve(rctx, k, "fp", "owner")
		if err == nil && r.Outcome == store.IdemAcquired {
			if i%2 == 0 {
				_, err = idem.Complete(rctx, k, "owner", rec, time.Hour)
			} else {
				_, err = idem.Release(rctx, k, "owner")
			}
		}
		cancel()
		if err != nil || r.Outcome != store.IdemAcquired {
			t.Fatalf("request %d on a healthy master while one stalled: %+v %v", i+1, r, err)
		}
	}
	if r, err := idem.Reserve(ctx, healthy[0], "fp", "retry"); err != nil || r.Outcome != store.IdemReplay {
		t.Fatalf("a retry of a completed request on a healthy master: %+v %v", r, err)
	}

	thaw()
	testenv.Eventually(t, 20*time.Second, func() bool {
		r, err := idem.Reserve(ctx, stalled, "fp", "retry")
		return err == nil && r.Outcome == store.IdemAcquired
	}, "a retry of the stalled request did not get its key once the master woke")
	// The token is counted once its pipeline returns, which may be just
	// after the retry above found the key free.
	given := func() int {
		mu.Lock()
		defer mu.Unlock()
		return abandoned[store.AbandonReleased] + abandoned[store.AbandonMarked]
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return given() >= 1 },
		"the stalled reserve's abandoned token was never given up")
	time.Sleep(3 * abandonPause)
	mu.Lock()
	defer mu.Unlock()
	if n := abandoned[store.AbandonReleased] + abandoned[store.AbandonMarked]; n != 1 {
		t.Fatalf("abandoned tokens given up: %v, want the stalled reserve's one", abandoned)
	}
}

// abandonPause is the store's pause between tries to give up abandoned
// tokens: three of them pass without a second give-up.
const abandonPause = 100 * time.Millisecond
