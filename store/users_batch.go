package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// First-sight user records. Every authenticated request and handshake
// records its user (EnsureUser) unless the instance already knows the id; a
// freshly started instance knows none, so the reconnect storm after a
// restart would make one INSERT per client. Records that arrive together
// share one statement, as the subscribe checks do (realtime_batch.go): a
// lone record goes out at once (or after the realtime linger), the rest
// queue while one is in flight.
const (
	ensureUsersInFlight     = 1
	ensureUsersBatchMax     = 512
	ensureUsersSharedBudget = 5 * time.Second
)

// ensureUsersSQL records each id of the array once (an id twice in one
// batch conflicts with itself and is skipped). The ids are inserted in uuid
// order, so two instances' batches that share new ids wait for each other
// in one order and never deadlock.
const ensureUsersSQL = `INSERT INTO users(id) SELECT u FROM unnest($1::text[]::uuid[]) AS u ORDER BY u ON CONFLICT DO NOTHING`

// ensureUserCall is one record waiting in a batch.
type ensureUserCall struct {
	sharedCall
	id string
}

func newEnsureUsersBatcher(s *Store) *stmtBatcher[*ensureUserCall] {
	return newStmtBatcher(ensureUsersInFlight, ensureUsersBatchMax, ensureUsersSharedBudget, "record users",
		func(ctx context.Context, live []*ensureUserCall) error {
			users := make([]string, len(live))
			for i, c := range live {
				users[i] = c.id
			}
			return s.execShared(ctx, ensureUsersSQL, users)
		})
}

// EnsureUserStats counts the EnsureUser calls that had to write (the id
// was not known) and the statements that recorded them.
func (s *Store) EnsureUserStats() SubscribeCheckStats { return s.ensureUsers.stats() }

// recordUser records id, batched with other callers' records. An id that
// is not a UUID goes alone, so its error is its own and no batch-mate's.
//
// The record, its wait for a statement included, is bounded by the request
// budget from the call: a caller queued behind a stalled statement (a lock
// on users) leaves at that deadline instead of waiting for the stalled
// statement and then for its own, and running out of it is ErrDatabaseBusy
// like any request statement past its budget.
func (s *Store) recordUser(ctx context.Context, id string) error {
	b := s.ensureUsers
	if err := b.begin(ctx); err != nil {
		return err
	}
	if !ids.Valid(id) {
		b.queries.Add(1)
		_, err := s.reqExec(ctx, "INSERT INTO users(id) VALUES ($1) ON CONFLICT DO NOTHING", id)
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	err := b.do(&ensureUserCall{sharedCall: sharedCall{ctx: bctx}, id: id})
	if err != nil && err == bctx.Err() && ctx.Err() == nil {
		// Never run: the statements ahead of it held the way past its budget.
		return fmt.Errorf("%w: user record queued past its budget", ErrDatabaseBusy)
	}
	return err
}

// execShared is reqExec for a statement shared by the callers of a batch,
// whose ctx (SharedContext) only their budgets end: a statement cut short
// by them is ErrDatabaseBusy, as one past its own budget is. The pool wait
// has a budget of its own, so what is left of the callers' budgets after
// their wait in the queue never reads as an unreachable server; but once
// every caller has left (ctx canceled, not past its deadline: an instance
// shutting down) nobody waits for the connection, and the wait ends.
func (s *Store) execShared(ctx context.Context, sql string, args ...any) error {
	actx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancelWait()
		}
	})
	defer stop()
	conn, err := s.acquire(actx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	if _, err = conn.Exec(sctx, sql, args...); err != nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrDatabaseBusy, err)
	}
	return err
}
