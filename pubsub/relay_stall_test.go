package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// A Redis that stalls instead of failing runs the calls it already received
// when it wakes: the relay's delivery lock for a row, whose caller timed
// out and moved on, is then held for nobody. The lock only covers one
// PUBLISH, so it lives a few publish budgets, not the 30 s of the other
// coordination locks: the row's event goes out within seconds of Redis
// waking, not half a minute later.
func TestRelayDeliversPastALockTakenWhileRedisStalled(t *testing.T) {
	st, pool := openStore(t)
	d := postWithDeadRedis(t, st, pool, 1)
	ch := pubsub.DialogChannel(d)

	const budget = 200 * time.Millisecond
	r, rt := testenv.StallableRedis(t, 1, budget)
	relay, err := pubsub.NewRelay(st, rt, pubsub.RelayConfig{Grace: time.Millisecond, PublishTimeout: budget}, discard)
	if err != nil {
		t.Fatal(err)
	}
	// As on a running service, the lock script is loaded (one acquire
	// loads it), so a stalled EVALSHA runs when Redis wakes instead of
	// answering NOSCRIPT. On a busy machine a call can pass the short
	// budget before anything is stopped: the warm-up is tried again, and
	// the pool warmed again, as its timed-out calls took connections out.
	warm := rds.NewLocker(rt)
	testenv.Eventually(t, 10*time.Second, func() bool {
		lk, _, err := warm.Acquire(context.Background(), rds.LockDelivery, "warm", time.Second)
		return err == nil && lk.Release(context.Background()) == nil
	}, "the lock script never ran")
	testenv.WarmPool(t, rt)
	admin := r.AdminClient(1)
	defer admin.Close()

	thaw := r.Freeze(t)
	_, published, err := relay.RunOnce(context.Background())
	if err == nil || published != 0 {
		t.Fatalf("a relay pass against a stopped Redis: published %d, err %v", published, err)
	}
	thaw()
	// The stalled acquire runs now and takes the row's lock, for a second:
	// its fencing counter, which only a taken lock counts and which lives
	// a day, shows it even when this check comes after that second.
	testenv.Eventually(t, 5*time.Second, func() bool {
		for _, k := range admin.Keys(context.Background(), "han:coord:fence:delivery:*").Val() {
			if k != rds.FenceKey(rds.LockDelivery, "warm") {
				return true
			}
		}
		return false
	}, "the stalled lock call never ran: the test does not show what it means to")
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, _, _ = relay.RunOnce(context.Background())
		return pendingFor(t, pool, ch) == 0
	}, "the row was not published within 10 s of Redis waking")
	t.Logf("published %v after Redis woke", time.Since(start).Round(100*time.Millisecond))
}
