package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A request transaction gives up on a row lock held elsewhere and on a
// pool with no free connection within the request budget, with
// ErrDatabaseBusy; its lock and statement timeouts last only for the
// transaction, never for the connection's session.
func TestRequestTransactionsStayWithinTheirBudget(t *testing.T) {
	_, _ = openStore(t) // migrations
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The set-up, and what must succeed once the pool is free again, run
	// with a generous budget: on a loaded machine connecting alone can take
	// longer than the short budget under test.
	setUp := store.New(pool)
	setUp.SetRequestTimeout(setUpBudget)
	s := store.New(pool)
	s.SetRequestTimeout(300 * time.Millisecond)
	alice, bob := ids.New(), ids.New()
	for _, u := range []string{alice, bob} {
		if err := setUp.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	locked, err := setUp.CreateDialog(ctx, ids.New(), alice, "locked", []string{bob})
	if err != nil {
		t.Fatal(err)
	}
	free, err := setUp.CreateDialog(ctx, ids.New(), alice, "free", []string{bob})
	if err != nil {
		t.Fatal(err)
	}

	locker, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id=$1 FOR UPDATE", locked.ID); err != nil {
		t.Fatal(err)
	}
	// A connection used just now: the send's short budget goes to no ping.
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// A generous outer deadline only keeps a wrong implementation from
	// hanging the test; the budget is what must end the wait.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, _, _, err = s.SendMessage(wctx, store.SendMessage{ID: ids.New(), DialogID: locked.ID, SenderID: alice, Body: "x"})
	if !errors.Is(err, store.ErrDatabaseBusy) || !store.IsDatabaseBusy(err) {
		t.Fatalf("send behind a held row lock: %v", err)
	}
	// The pool's only connection went back with its session untouched.
	for _, name := range []string{"lock_timeout", "statement_timeout"} {
		var v string
		if err := pool.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != "0" {
			t.Fatalf("%s outlived the transaction: %q", name, v)
		}
	}

	// With the only connection taken, the wait for one is bounded too.
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, err = s.SendMessage(wctx, store.SendMessage{ID: ids.New(), DialogID: free.ID, SenderID: alice, Body: "x"})
	if !errors.Is(err, store.ErrDatabaseBusy) {
		held.Release()
		t.Fatalf("send while the pool had no free connection: %v", err)
	}
	// Single statements of request paths too.
	_, err = s.DialogForMember(wctx, free.ID, alice)
	_, err2 := s.ProjectAccess(wctx, ids.New(), alice)
	held.Release()
	if !errors.Is(err, store.ErrDatabaseBusy) || !errors.Is(err2, store.ErrDatabaseBusy) {
		t.Fatalf("reads while the pool had no free connection: %v / %v", err, err2)
	}
	if d, err := setUp.DialogForMember(ctx, free.ID, alice); err != nil || d.ID != free.ID {
		t.Fatalf("read once a connection is free: %v", err)
	}
	if wctx.Err() != nil {
		t.Fatal("the outer deadline, not the request budget, ended a wait")
	}
	if _, _, _, err := setUp.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: free.ID, SenderID: alice, Body: "x"}); err != nil {
		t.Fatalf("send to an unlocked dialog: %v", err)
	}
}

// A request transaction on a PostgreSQL that stops answering mid-way (a
// stopped process, a network that drops packets) ends within its budget
// with ErrDatabaseBusy: the server's own timeouts cannot fire on a server
// that does not run, so the client bounds the transaction too. Without
// that, the request held its connection (and an idempotency key its lock)
// until the client hung up; now pgx closes the broken connection.
func TestARequestTransactionOnAStalledServerEndsWithinItsBudget(t *testing.T) {
	ctx := context.Background()
	s, setUp, p := storeThroughProxy(t, 300*time.Millisecond)
	alice, bob := ids.New(), ids.New()
	for _, id := range []string{alice, bob} {
		if err := setUp.EnsureUser(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := setUp.CreateDialog(ctx, ids.New(), alice, "warm", []string{bob}); err != nil {
		t.Fatal(err) // the pool's connection was used just now: no ping before the next use
	}
	p.Blackhole(true)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.CreateDialog(wctx, ids.New(), alice, "stalled", []string{bob})
	if wctx.Err() != nil {
		t.Fatalf("the transaction waited for the stalled server until the caller gave up (%v)", time.Since(start))
	}
	if !errors.Is(err, store.ErrDatabaseBusy) {
		t.Fatalf("transaction on a stalled server: %v, want ErrDatabaseBusy", err)
	}
	t.Logf("ended after %v", time.Since(start).Round(10*time.Millisecond))
}

// A send whose statement reached PostgreSQL but whose answer did not come
// back within the client's deadline (a stalled server or network) is not
// answered database_busy, which promises nothing was committed: the
// statement may have committed. It is database_unavailable, whose retry
// with the same idempotency key or clientMessageId answers the outcome.
func TestASendWhoseAnswerNeverComesIsNotBusy(t *testing.T) {
	ctx := context.Background()
	// The send must reach PostgreSQL within its budget however loaded the
	// machine, and then waits the budget out: a generous one.
	s, setUp, p := storeThroughProxy(t, answeredBudget)
	s.SetSendLinger(0)
	setUp.SetSendLinger(0)
	alice, bob := ids.New(), ids.New()
	for _, id := range []string{alice, bob} {
		if err := setUp.EnsureUser(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	d, err := setUp.CreateDialog(ctx, ids.New(), alice, "", []string{bob})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := setUp.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: "warm"}); err != nil {
		t.Fatal(err) // the pool's connection was used just now: no ping before the next use
	}
	p.Blackhole(true)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, _, _, err = s.SendMessage(wctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: "unanswered"})
	if wctx.Err() != nil {
		t.Fatal("the send waited until its caller gave up")
	}
	if err == nil || errors.Is(err, store.ErrDatabaseBusy) || !store.IsPGUnavailable(err) {
		t.Fatalf("a send whose answer never came: %v, want unavailable (outcome unknown), not busy", err)
	}
}

// answeredBudget is the request budget of the tests whose statements must
// be answered (or reach PostgreSQL) before the one that gets no answer: on
// a loaded machine a round trip can take far longer than the short budgets
// of the other tests, and an answer that came too late would turn the
// outcome under test into ErrDatabaseBusy. It is the service's default;
// the unanswered statement waits it out, so it is not made longer.
const answeredBudget = 2 * time.Second

// setUpBudget is the request budget of the Store that sets a test up: the
// set-up has nothing to wait for, so the budget only keeps a broken one
// from hanging, never cuts a slow one short.
const setUpBudget = time.Minute

// storeThroughProxy is a Store with the request budget given and a pool of
// 2 whose PostgreSQL connections go through a fault proxy, for the tests of
// a server that stalls, and a Store on the same pool for the set-up, with
// a generous budget: connecting and the set-up's statements can take longer
// than the budget under test on a loaded machine, and must not fail the
// test before the step it is about. The pool has a connection, used just
// now, when it is returned (no ping before its next use). The proxy is
// opened again and its links cut before the pool closes, so the clean-up of
// the connections pgx gave up on does not wait on it.
func storeThroughProxy(t *testing.T, budget time.Duration) (s, setUp *store.Store, p *faultproxy.Proxy) {
	t.Helper()
	_, _ = openStore(t) // migrations
	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), setUpBudget)
	defer cancel()
	pool, err := store.OpenPG(ctx, proxied, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(func() {
		p.Blackhole(false)
		p.Cut()
	})
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	s, setUp = store.New(pool), store.New(pool)
	s.SetRequestTimeout(budget)
	setUp.SetRequestTimeout(setUpBudget)
	return s, setUp, p
}

// A request transaction cut short by its budget before its COMMIT committed
// nothing: ErrDatabaseBusy. One whose COMMIT got no answer in time may have
// committed: it is not busy (which promises nothing was), but unavailable,
// its outcome unknown.
func TestARequestTransactionTellsAnUnansweredCommitFromABusyOne(t *testing.T) {
	ctx := context.Background()
	// A statement without an answer fails the transaction busy however
	// long the machine takes to send it: the short budget will do.
	s, _, p := storeThroughProxy(t, 300*time.Millisecond)
	err := s.RequestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		p.Blackhole(true) // the statement gets no answer
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	})
	if !errors.Is(err, store.ErrDatabaseBusy) {
		t.Fatalf("a statement without an answer before the COMMIT: %v, want ErrDatabaseBusy", err)
	}
	// BEGIN and the statement must be answered, and the COMMIT sent,
	// within the budget: a generous one, which the COMMIT then waits out.
	s, _, p = storeThroughProxy(t, answeredBudget)
	var stmtErr error
	err = s.RequestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, stmtErr = tx.Exec(ctx, "SELECT 1"); stmtErr != nil {
			return stmtErr
		}
		p.Blackhole(true) // the COMMIT gets no answer
		return nil
	})
	if stmtErr != nil {
		t.Fatalf("the statement before the COMMIT got no answer within %v: %v", answeredBudget, stmtErr)
	}
	if err == nil || errors.Is(err, store.ErrDatabaseBusy) || !store.IsPGUnavailable(err) {
		t.Fatalf("a COMMIT without an answer: %v, want unavailable (outcome unknown), not busy", err)
	}
}
