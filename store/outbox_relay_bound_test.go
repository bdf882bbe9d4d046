package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// The relay's claim transaction carries its own lock_timeout and
// statement_timeout: behind a lock on the outbox (a migration's, say) the
// server cuts the claim at the claim budget (lock_not_available or
// query_canceled: IsDatabaseBusy) instead of letting it wait for as long as
// the lock is held, and nothing is published. (The client-side deadline, twice as long, is what ends a claim
// on a connection that went silent.)
func TestRelayClaimGivesUpBehindALockedOutbox(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	// The caller's context is no bound here: the relay runs on one only its
	// Close ends.
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	published := 0
	run, err := st.RelayOutbox(rctx, 0, 10, func(context.Context, pubsub.OutboxRow) error {
		published++
		return nil
	})
	if !store.IsDatabaseBusy(err) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim behind a locked outbox: err %v; want the server's lock_timeout or statement_timeout", err)
	}
	if run.Claimed != 0 || published != 0 {
		t.Fatalf("a failed claim claimed %d rows and published %d", run.Claimed, published)
	}
}
