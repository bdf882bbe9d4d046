package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "57014")
}

// requestTx runs fn in a transaction of a request path within the
// request budget: the wait for a pool connection is bounded by it, and
// lock_timeout and statement_timeout are set to it for this transaction
// only (SET LOCAL, sent in the same simple-protocol message as BEGIN: one
// round trip, and nothing outlives the transaction, so the setting is safe
// behind a transaction-pooling proxy). A budget overrun comes back wrapped
// in ErrDatabaseBusy. Background jobs and migrations do not use it: they
// keep their own budgets.
func (s *Store) requestTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	full := s.poolFull()
	actx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	conn, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		// Waiting for a pool full of connections in use is "busy"; a
		// timeout while dialling a new connection is an unreachable
		// server, which stays database_unavailable.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && (full || s.poolFull()) {
			return fmt.Errorf("%w: no pool connection within %v", ErrDatabaseBusy, s.reqTimeout)
		}
		return err
	}
	defer conn.Release()
	ms := s.reqTimeout.Milliseconds()
	begin := fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms)
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{BeginQuery: begin}, fn)
	if err != nil && ctx.Err() == nil && IsDatabaseBusy(err) {
		return fmt.Errorf("%w: %w", ErrDatabaseBusy, err)
	}
	return err
}

// poolFull reports whether every connection the pool may open is in use.
func (s *Store) poolFull() bool {
	st := s.pool.Stat()
	return st.AcquiredConns() >= st.MaxConns()
}
