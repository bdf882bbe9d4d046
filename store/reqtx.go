package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultRequestTimeout is the budget of a request transaction when none is
// configured (HAN_DB_REQUEST_TIMEOUT).
const DefaultRequestTimeout = 2 * time.Second

// ErrDatabaseBusy means PostgreSQL is reachable but a request could not be
// served within its budget: no pool connection came free in time, a row
// lock was not granted in time (lock_timeout), or a statement ran past
// statement_timeout. The API answers 503 database_busy with Retry-After;
// it is not an outage, so readiness stays up.
var ErrDatabaseBusy = errors.New("store: database busy")

// SetRequestTimeout sets the budget of request transactions (d ≥ 1ms;
// smaller values are ignored). Call it before the Store is used.
func (s *Store) SetRequestTimeout(d time.Duration) {
	if d >= time.Millisecond {
		s.reqTimeout = d
	}
}

// RequestTimeout is the budget of request transactions.
func (s *Store) RequestTimeout() time.Duration { return s.reqTimeout }

// IsDatabaseBusy reports whether err means the database was busy rather
// than down: ErrDatabaseBusy, or the SQLSTATE of a lock wait or a
// statement cut short by the server (55P03 lock_not_available, 57014
// query_canceled).
func IsDatabaseBusy(err error) bool {
	if errors.Is(err, ErrDatabaseBusy) {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == codeLockNotAvailable || pe.Code == codeQueryCanceled)
}

// SQLSTATEs of a busy database: a lock wait over lock_timeout and a
// statement cut short by statement_timeout.
const (
	codeLockNotAvailable = "55P03"
	codeQueryCanceled    = "57014"
)

// requestTx runs fn in a transaction of a request path within the
// request budget: the wait for a pool connection is bounded by it, and
// lock_timeout and statement_timeout are set to it for this transaction
// only (SET LOCAL, sent in the same simple-protocol message as BEGIN: one
// round trip, and nothing outlives the transaction, so the setting is safe
// behind a transaction-pooling proxy). The server's timeouts cannot end a
// wait on a server that stalls (a stopped process, a network that drops
// packets), so the client gives the whole transaction one budget more
// than a statement's: fn gets that context, and its statements must use
// it. A budget overrun comes back wrapped in ErrDatabaseBusy, but for a
// COMMIT that got no answer in time (it may have committed). Background
// jobs and migrations do not use it: they keep their own budgets.
func (s *Store) requestTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tctx, cancel := context.WithTimeout(ctx, 2*s.reqTimeout)
	defer cancel()
	ms := s.reqTimeout.Milliseconds()
	begin := fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms)
	committing := false // fn succeeded: what fails after it is the COMMIT
	err = pgx.BeginTxFunc(tctx, conn, pgx.TxOptions{BeginQuery: begin}, func(tx pgx.Tx) error {
		err := fn(tctx, tx)
		committing = err == nil
		return err
	})
	switch {
	case err == nil || ctx.Err() != nil:
	case IsDatabaseBusy(err):
		return fmt.Errorf("%w: %w", ErrDatabaseBusy, err)
	case errors.Is(err, context.DeadlineExceeded) && (!committing || pgconn.SafeToRetry(err)):
		// Cut short before the COMMIT, or the COMMIT never sent (its
		// context was done already): nothing was committed.
		return fmt.Errorf("%w: %w", ErrDatabaseBusy, err)
	}
	// A COMMIT whose answer did not come in time may have committed: not
	// busy (which says nothing was), but unavailable with its outcome
	// unknown.
	return err
}

// acquire takes a pool connection for a request, waiting at most the
// request budget. Running out of budget while other requests hold
// connections is "busy" (ErrDatabaseBusy): the server answers them, and the
// pool may be full or replacing a connection at that moment. Running out of
// budget while no connection is in use means every wait was for a new
// connection to be dialled: an unreachable server, which stays
// database_unavailable.
func (s *Store) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	return s.acquireWithin(ctx, s.reqTimeout)
}

// acquireWithin is acquire with the budget left to a request.
func (s *Store) acquireWithin(ctx context.Context, budget time.Duration) (*pgxpool.Conn, error) {
	inUse := s.poolInUse()
	actx, cancel := context.WithTimeout(ctx, budget)
	conn, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && (inUse || s.poolInUse()) {
			return nil, fmt.Errorf("%w: no pool connection within %v", ErrDatabaseBusy, budget)
		}
		return nil, err
	}
	return conn, nil
}

// The single statements of request paths (reads, and writes that need no
// transaction) use reqQueryRow, reqQuery and reqExec instead of the pool's
// own methods, so their wait for a connection is bounded like a
// transaction's, and so is the statement: it runs under a deadline of the
// request budget (its own SET LOCAL would need a transaction), and one cut
// short by it comes back wrapped in ErrDatabaseBusy. Without it a statement
// waiting on a lock (a migration's) held its request and its connection for
// as long as the lock was held, and the instance's shutdown with them.

func (s *Store) reqQueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	conn, err := s.acquire(ctx)
	if err != nil {
		return errRow{err}
	}
	sctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	return releasingRow{conn.QueryRow(sctx, sql, args...), conn, ctx, cancel}
}

func (s *Store) reqQuery(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	rows, err := conn.Query(sctx, sql, args...)
	if err != nil {
		cancel()
		conn.Release()
		return nil, stmtBusy(ctx, err)
	}
	return &releasingRows{Rows: rows, conn: conn, ctx: ctx, cancel: cancel}, nil
}

func (s *Store) reqExec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer conn.Release()
	sctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	tag, err := conn.Exec(sctx, sql, args...)
	return tag, stmtBusy(ctx, err)
}

// stmtBusy wraps in ErrDatabaseBusy the error of a statement its request
// budget cut short (the caller's own ctx still alive).
func stmtBusy(ctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrDatabaseBusy, err)
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// releasingRow gives the connection back once the row is scanned (every
// caller scans the row it asked for).
type releasingRow struct {
	row    pgx.Row
	conn   *pgxpool.Conn
	ctx    context.Context // the caller's
	cancel context.CancelFunc
}

func (r releasingRow) Scan(dest ...any) error {
	defer r.conn.Release()
	defer r.cancel()
	return stmtBusy(r.ctx, r.row.Scan(dest...))
}

// releasingRows gives the connection back when the rows are closed or read
// to the end.
type releasingRows struct {
	pgx.Rows
	conn   *pgxpool.Conn
	ctx    context.Context // the caller's
	cancel context.CancelFunc
}

func (r *releasingRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *releasingRows) Err() error { return stmtBusy(r.ctx, r.Rows.Err()) }

func (r *releasingRows) Close() {
	r.Rows.Close()
	if r.conn != nil {
		r.cancel()
		r.conn.Release()
		r.conn = nil
	}
}

// poolInUse reports whether any request holds a pool connection right now.
func (s *Store) poolInUse() bool { return s.pool.Stat().AcquiredConns() > 0 }
