package pubsub_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// A relay run that claimed a full batch goes again at once only when it
// published something: when every row of the batch is another deliverer's
// for now (its delivery lock held), an immediate rerun would claim the
// same rows again and again until the locks expire, a busy loop of
// PostgreSQL claims and lock calls. It waits its interval instead.
func TestRelayWaitsWhenItsWholeBatchIsHeldElsewhere(t *testing.T) {
	st, pool := openStore(t)
	const rows = 2
	d := postWithDeadRedis(t, st, pool, rows)
	ch := pubsub.DialogChannel(d)
	r, rt := testenv.StallableRedis(t, 1, time.Second)
	admin := r.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()

	// Another deliverer holds every row's delivery lock.
	msgs, err := pool.Query(ctx, "SELECT entity_id FROM outbox WHERE channel=$1 AND delivered_at IS NULL", ch)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for msgs.Next() {
		var id string
		if err := msgs.Scan(&id); err != nil {
			t.Fatal(err)
		}
		held = append(held, id)
	}
	msgs.Close()
	other := rds.NewLocker(rt)
	for _, id := range held {
		if _, _, err := other.Acquire(ctx, rds.LockDelivery, id, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if len(held) != rows {
		t.Fatalf("%d rows to hold, want %d", len(held), rows)
	}

	relay, err := pubsub.NewRelay(st, rt, pubsub.RelayConfig{Grace: time.Millisecond, Batch: rows, Interval: 500 * time.Millisecond}, discard)
	if err != nil {
		t.Fatal(err)
	}
	calls := func() int {
		for _, l := range strings.Split(admin.Info(ctx, "commandstats").Val(), "\n") {
			if strings.HasPrefix(l, "cmdstat_evalsha:calls=") {
				n, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(l, ",", 2)[0], "cmdstat_evalsha:calls="))
				return n
			}
		}
		return 0
	}
	before := calls()
	relay.Start()
	time.Sleep(2 * time.Second)
	relay.Close()
	// A run at the start and one per interval (500 ms, jittered ±20 %):
	// six runs in two seconds at most, each trying both rows' locks — a
	// dozen lock calls, with room for a slow machine, against a busy loop's
	// thousands.
	if n := calls() - before; n > 10*rows {
		t.Fatalf("%d lock calls in 2 s for %d rows held elsewhere: the relay reran without waiting", n, rows)
	}
	if got := pendingFor(t, pool, ch); got != rows {
		t.Fatalf("%d rows pending, want the %d held elsewhere", got, rows)
	}
}
