package rds_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

func TestLockOwnershipAndFencing(t *testing.T) {
	ctx := context.Background()
	l := rds.NewLocker(apiClient(t, env.Redis.URL(1)))
	a, _, err := l.Acquire(ctx, rds.LockDelivery, "m-owner", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, wait, err := l.Acquire(ctx, rds.LockDelivery, "m-owner", time.Minute); !errors.Is(err, rds.ErrLockHeld) || wait <= 0 {
		t.Fatalf("a second owner must be refused with the holder's TTL: %v %v", wait, err)
	}
	// Only the owner extends and releases: a forged acquisition with
	// another owner token is refused and changes nothing.
	forged := *a
	forged.Owner = "someone-else"
	if err := forged.Extend(ctx, time.Minute); !errors.Is(err, rds.ErrLockLost) {
		t.Fatalf("non-owner extend: %v", err)
	}
	if err := forged.Release(ctx); !errors.Is(err, rds.ErrLockLost) {
		t.Fatalf("non-owner release: %v", err)
	}
	if err := a.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("owner extend: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("owner release: %v", err)
	}
	if err := a.Release(ctx); !errors.Is(err, rds.ErrLockExpired) {
		t.Fatalf("a released lock is gone: %v", err)
	}

	// A late owner: its lock expired and another owner took it. It can
	// neither extend nor release the new owner's lock, and the new fence is
	// larger.
	late, _, err := l.Acquire(ctx, rds.LockDelivery, "m-late", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	rdb := apiClient(t, env.Redis.URL(1))
	testenv.Eventually(t, 5*time.Second, func() bool { return rdb.Exists(ctx, late.Key).Val() == 0 }, "lock did not expire")
	if err := late.Extend(ctx, time.Minute); !errors.Is(err, rds.ErrLockExpired) {
		t.Fatalf("extend after expiry: %v", err)
	}
	next, _, err := l.Acquire(ctx, rds.LockDelivery, "m-late", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence <= late.Fence {
		t.Fatalf("fencing token must grow: %d then %d", late.Fence, next.Fence)
	}
	if err := late.Release(ctx); !errors.Is(err, rds.ErrLockLost) {
		t.Fatalf("late owner release: %v", err)
	}
	if err := late.Extend(ctx, time.Minute); !errors.Is(err, rds.ErrLockLost) {
		t.Fatalf("late owner extend: %v", err)
	}
	if owner := rdb.Get(ctx, next.Key).Val(); owner != next.Owner {
		t.Fatal("the late owner changed the new owner's lock")
	}
	if ttl := rdb.PTTL(ctx, rds.FenceKey(rds.LockDelivery, "m-late")).Val(); ttl <= 0 {
		t.Fatalf("fence counter without TTL: %v", ttl)
	}
	_ = next.Release(ctx)
}

// Concurrent acquirers: exactly one wins each round and the fencing tokens
// of the winners strictly increase.
func TestLockFencesStrictlyIncrease(t *testing.T) {
	ctx := context.Background()
	l := rds.NewLocker(apiClient(t, env.Redis.URL(1)))
	var last int64
	for round := 0; round < 20; round++ {
		var mu sync.Mutex
		var wins []*rds.Lock
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk, _, err := l.Acquire(ctx, rds.LockSafetyRecovery, "task-1", time.Minute)
				if err == nil {
					mu.Lock()
					wins = append(wins, lk)
					mu.Unlock()
				} else if !errors.Is(err, rds.ErrLockHeld) {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if len(wins) != 1 {
			t.Fatalf("round %d: %d winners", round, len(wins))
		}
		if wins[0].Fence <= last {
			t.Fatalf("round %d: fence %d after %d", round, wins[0].Fence, last)
		}
		last = wins[0].Fence
		if err := wins[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A Redis that stalls instead of failing runs an acquire whose caller gave
// up waiting when it wakes: the lock is then held for an owner token nobody
// knows, and every instance is refused it until its TTL ends. The Locker
// remembers the token of the unanswered acquire and its next Acquire
// releases that lock first, so the guarded work resumes within moments of
// Redis waking instead of a whole TTL later.
func TestLockTakenWhileRedisStalledIsReleasedByTheNextAcquire(t *testing.T) {
	ctx := context.Background()
	r, rdb := testenv.StallableRedis(t, 1, 200*time.Millisecond)
	admin := r.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	l := rds.NewLocker(rdb)
	// As on a running service the script is loaded, so the stalled EVALSHA
	// runs when Redis wakes instead of answering NOSCRIPT.
	warm, _, err := l.Acquire(ctx, rds.LockPresenceSweep, "warm", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A call can also give up before its command left the client (a
	// connection the pool dialled while Redis was stopped, or a loaded
	// machine that let the write deadline pass): that acquire takes
	// nothing and there is nothing to show, so the stall is tried again on
	// another lock, a few times.
	var id, key string
	for attempt := 1; ; attempt++ {
		id = fmt.Sprint("dead-", attempt)
		key = rds.LockKey(rds.LockPresenceSweep, id)
		thaw := r.Freeze(t)
		if _, _, err := l.Acquire(ctx, rds.LockPresenceSweep, id, time.Minute); !errors.Is(err, rds.ErrRedisUnavailable) {
			t.Fatalf("acquire against a stopped Redis: %v", err)
		}
		thaw()
		ran := false
		for deadline := time.Now().Add(3 * time.Second); !ran && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			ran = admin.Exists(ctx, key).Val() == 1
		}
		if ran {
			break
		}
		if attempt == 5 {
			t.Fatal("the stalled acquire never ran in 5 tries: the test does not show what it means to")
		}
		t.Logf("try %d: the stalled acquire never reached Redis; again", attempt)
	}
	if _, _, err := rds.NewLocker(rdb).Acquire(ctx, rds.LockPresenceSweep, id, time.Minute); !errors.Is(err, rds.ErrLockHeld) {
		t.Fatalf("the lock the stalled acquire took must refuse another locker: %v", err)
	}

	start := time.Now()
	var lk *rds.Lock
	testenv.Eventually(t, 5*time.Second, func() bool {
		lk, _, err = l.Acquire(ctx, rds.LockPresenceSweep, id, time.Minute)
		return err == nil
	}, "the lock taken by the stalled acquire was not released by the next acquires")
	t.Logf("acquired %v after Redis woke", time.Since(start).Round(10*time.Millisecond))
	if owner := admin.Get(ctx, key).Val(); owner != lk.Owner {
		t.Fatalf("the lock is held by %q, not by the new acquisition", owner)
	}
	// The remembered token is spent: later acquires release nothing, and
	// the new owner's lock stays.
	time.Sleep(300 * time.Millisecond)
	if _, _, err := l.Acquire(ctx, rds.LockPresenceSweep, id, time.Minute); !errors.Is(err, rds.ErrLockHeld) {
		t.Fatalf("a later acquire must find the new owner's lock: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
