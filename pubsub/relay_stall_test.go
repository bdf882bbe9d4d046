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
	// answering NOSCRIPT.
	lk, _, err := rds.NewLocker(rt).Acquire(context.Background(), rds.LockDelivery, "warm", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	thaw := r.Freeze(t)
	_, published, err := relay.RunOnce(context.Background())
	if err == nil || published != 0 {
		t.Fatalf("a relay pass against a stopped Redis: published %d, err %v", published, err)
	}
	thaw()
	// The stalled acquire has run by now and holds the row's lock.
	testenv.Eventually(t, 5*time.Second, func() bool {
		return len(r.AdminClient(1).Keys(context.Background(), "han:coord:lock:delivery:*").Val()) == 1
	}, "the stalled lock call never ran: the test does not show what it means to")
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, _, _ = relay.RunOnce(context.Background())
		return pendingFor(t, pool, ch) == 0
	}, "the row was not published within 10 s of Redis waking")
	t.Logf("published %v after Redis woke", time.Since(start).Round(100*time.Millisecond))
}
