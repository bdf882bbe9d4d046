package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TableLock is a lock another session holds on a table: the stall a
// migration's DDL, a VACUUM FULL or a hand-run maintenance statement
// causes. It is taken in an open transaction on a connection of its own
// and held until Release, or the test's end.
type TableLock struct {
	t    testing.TB
	url  string
	conn *pgx.Conn
	tx   pgx.Tx
	// PID is the holding backend's process id.
	PID uint32
}

// LockTable connects to url and takes a lock in mode (e.g. "ACCESS
// EXCLUSIVE") on table.
func LockTable(t testing.TB, url, table, mode string) *TableLock {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	l := &TableLock{t: t, url: url, conn: conn}
	t.Cleanup(func() { l.Release(); _ = conn.Close(ctx) })
	if l.tx, err = conn.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&l.PID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN "+mode+" MODE"); err != nil {
		t.Fatal(err)
	}
	return l
}

// Release ends the holding transaction; a second call does nothing.
func (l *TableLock) Release() {
	if l.tx == nil {
		return
	}
	if err := l.tx.Rollback(context.Background()); err != nil {
		l.t.Errorf("release the lock: %v", err)
	}
	l.tx = nil
}

// WaitBlocked waits (10 s at most) until exactly n backends wait for the
// lock. It watches from a connection of its own: within the holder's
// transaction PostgreSQL would keep showing the first reading.
func (l *TableLock) WaitBlocked(n int) {
	l.t.Helper()
	ctx := context.Background()
	watch, err := pgx.Connect(ctx, l.url)
	if err != nil {
		l.t.Fatal(err)
	}
	defer watch.Close(ctx)
	Eventually(l.t, 10*time.Second, func() bool {
		var got int
		if err := watch.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", l.PID).Scan(&got); err != nil {
			l.t.Fatal(err)
		}
		return got == n
	}, "backends waiting for the lock never numbered %d", n)
}
