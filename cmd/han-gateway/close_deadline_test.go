package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/pubsub"
)

// The drain spends one deadline, HAN_SHUTDOWN_TIMEOUT after the drain
// delay, however much work PostgreSQL or Redis (or both) leave pending
// when they stall: a batch of delivered marks on its way, marks queued
// behind it, a relay run marking what it published, and open sockets
// whose presence removals go out in batches. Each of those steps used to
// wait on its own budget (2 s for the marks, 2 s more for the relay's
// commit and its rollback, 5 s for a removal batch, a Redis timeout for
// every command in flight), one after another, so the process overran its
// stop budget by seconds. What a cut step leaves is not lost: the rows
// stay undelivered for the relay of another instance, and the presence
// entries stay for the survivors' sweep.
func TestCloseSpendsOneDeadlineWhenPostgreSQLOrRedisStalls(t *testing.T) {
	for _, stalled := range []string{"postgres+redis", "postgres", "redis"} {
		t.Run(stalled, func(t *testing.T) { closeWithStalls(t, stalled) })
	}
}

// closeWithStalls leaves work pending on every path, stalls the stalled
// dependencies ("postgres", "redis" or both, joined by +) and checks that
// Close ends within its deadline.
func closeWithStalls(t *testing.T, stalled string) {
	pg, pgURL := faultproxy.ForURL(t, env.DatabaseURL)
	rd0, rd0URL := faultproxy.ForURL(t, env.Redis.URL(0))
	rd1, rd1URL := faultproxy.ForURL(t, env.Redis.URL(1))
	vars := baseEnv()
	vars["DATABASE_URL"], vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = pgURL, rd0URL, rd1URL
	const timeout = time.Second
	vars["HAN_SHUTDOWN_TIMEOUT"] = timeout.String()
	vars["HAN_OUTBOX_GRACE"] = "1s" // the relay takes the rows whose marks are held
	// Every statement carries its text, which the proxy recognises.
	vars["HAN_DB_EXEC_MODE"] = "exec"
	lg := &closeLog{start: time.Now()}
	m := runLogged(t, vars, lg)
	aTok, bTok, dialogID := dialogWithSends(t, m, 1, "close-deadline")
	for _, tok := range []string{aTok, bTok} {
		connectRT(t, m, tok).subscribe(dialogID)
	}

	// A batch of delivered marks stuck on its way; the marks of the sends
	// after it queue behind it.
	heldMarks, releaseMarks := pg.HoldRequest([]byte("SET delivered_at = coalesce(delivered_at, now())"))
	defer releaseMarks()
	send := func(i int) {
		if code, b := callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, fmt.Sprintf(`{"body":"pending %d"}`, i),
			map[string]string{"Idempotency-Key": fmt.Sprintf("close-deadline-pending-%d", i)}); code != 201 {
			t.Fatalf("send: %d %s", code, b)
		}
	}
	send(0)
	select {
	case <-heldMarks:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch of delivered marks went out")
	}
	for i := 1; i < 4; i++ {
		send(i)
	}
	// Once the grace is over, the relay publishes the rows whose marks are
	// held and marks them itself: that statement is held too.
	heldRelay, releaseRelay := pg.HoldRequest([]byte("SET delivered_at = now(), attempts = attempts + 1"))
	defer releaseRelay()
	select {
	case <-heldRelay:
	case <-time.After(15 * time.Second):
		t.Fatalf("the relay did not mark the rows it published\nlog:\n%s", lg.String())
	}

	var stall []*faultproxy.Proxy
	if strings.Contains(stalled, "postgres") {
		stall = append(stall, pg)
	}
	if strings.Contains(stalled, "redis") {
		stall = append(stall, rd0, rd1)
	}
	for _, p := range stall {
		p.Blackhole(true)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	// HAN_DRAIN_DELAY is 0 here. The slack is for a busy test machine;
	// every step that waits on PostgreSQL or Redis is bounded by the
	// deadline, so the steps after it only close local resources.
	bound, slack := timeout, time.Second
	var took time.Duration
	select {
	case <-done:
		took = time.Since(start)
	case <-time.After(30 * time.Second):
		t.Fatalf("Close had not returned after 30 s\nlog:\n%s", lg.String())
	}
	for _, p := range stall {
		p.Blackhole(false)
	}
	if took > bound+slack {
		t.Fatalf("Close with %s stalled took %v, want at most HAN_SHUTDOWN_TIMEOUT=%v (+%v slack)\nlog:\n%s",
			stalled, took.Round(10*time.Millisecond), bound, slack, lg.String())
	}
	t.Logf("Close returned after %v", took.Round(10*time.Millisecond))

	// Nothing durable was lost: the rows whose marks were cut stay
	// undelivered, for the relay of another instance.
	pg.Cut()
	ctx := context.Background()
	db, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var undelivered int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE channel = $1 AND delivered_at IS NULL`,
		pubsub.DialogChannel(dialogID)).Scan(&undelivered); err != nil {
		t.Fatal(err)
	}
	if undelivered == 0 {
		t.Fatal("no row left undelivered: the cut marks went through after all, so the test proved nothing")
	}
}
