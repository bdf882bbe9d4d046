package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A relay closed in the middle of a run (the instance drains during a
// backlog) stops publishing at the next row, and the rows it already
// published stay marked delivered: the marks and the commit run on a
// context of their own. They ran on the cancelled one and rolled back, so
// the next relay published every one of those rows again.
func TestARelayClosedMidRunKeepsTheMarksOfWhatItPublished(t *testing.T) {
	st, pool := openStore(t)
	const n = 300
	d := postWithDeadRedis(t, st, pool, n)
	ch := pubsub.DialogChannel(d)
	rec := listen(t, ch)
	// The rows this relay leaves would be claimed by the next test's relay,
	// which shares the database.
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "UPDATE outbox SET delivered_at = now() WHERE channel = $1 AND delivered_at IS NULL", ch)
	})

	relay, err := pubsub.NewRelay(st, rtClient(t), pubsub.RelayConfig{Grace: time.Millisecond, Batch: 100}, discard)
	if err != nil {
		t.Fatal(err)
	}
	relay.Start()
	testenv.Eventually(t, 10*time.Second, func() bool { return len(rec.snapshot()) >= 3 }, "the relay published nothing")
	relay.Close()
	time.Sleep(300 * time.Millisecond) // the last published frames arrive

	got := rec.snapshot()
	published := make([]string, 0, len(got))
	for id := range got {
		published = append(published, id)
	}
	var unmarked int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox
		WHERE channel=$1 AND delivered_at IS NULL AND event_id = ANY($2::text[]::uuid[])`, ch, published).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	t.Logf("the relay published %d rows before Close", len(published))
	if unmarked != 0 {
		t.Fatalf("Close during a relay run lost the delivered marks of %d of the %d rows it had published (the next relay publishes them again)",
			unmarked, len(published))
	}
}
