package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockID is the advisory lock that serialises concurrent migrators
// (several instances starting at once).
const migrationLockID = 0x68616e6d6967 // "hanmig"

// migrationLockTimeout bounds each wait of a migration for a table lock
// (lock_timeout, set for the migration's transaction only). While DDL waits
// for its lock, every new query on the table queues behind it, so this is
// what a request of the running release may lose to a migration: a
// quarter of the request budget HAN_DB_REQUEST_TIMEOUT (2 s by default),
// which leaves the request most of its budget. It is still far longer than
// a request's own transactions on the tables (milliseconds, and never more
// than that budget), which an attempt waits out.
const migrationLockTimeout = 500 * time.Millisecond

// migrationRetryFirst and migrationRetryMax bound the pause between two
// attempts of a migration whose lock wait timed out: it doubles from the
// first to the max, and each pause is drawn at random from its upper half,
// so migrators retrying together spread out. Between attempts nothing
// queues on the table; during one, a query waits migrationLockTimeout at
// most, however many attempts a long reader (pg_dump) causes.
const (
	migrationRetryFirst = 500 * time.Millisecond
	migrationRetryMax   = 5 * time.Second
)

// Migrate applies every embedded migration not yet recorded in
// schema_migrations, each in its own transaction. It is idempotent and safe
// to run from several processes at once. It returns the versions applied.
// A database that records every migration already costs one read and
// takes no lock, so instances starting together do not queue behind each
// other for nothing.
//
// Each transaction first takes the migration lock with
// pg_advisory_xact_lock, which PostgreSQL releases at COMMIT or ROLLBACK:
// no lock outlives its transaction, so a migrator that dies, or a
// connection handed on by a transaction-pooling proxy, never leaves it
// held. Its statements with parameters use unnamed prepared statements
// (pgx.QueryExecModeExec) whatever the pool's exec mode: behind a
// transaction pooler, a named statement left on the server connection
// would collide with the next migrator's of the same name. The service
// still migrates over HAN_DATABASE_DIRECT_URL, because DDL and long
// statements belong on a direct connection.
//
// A migration never makes the running release's queries wait long behind
// it: each of its lock waits gives up after migrationLockTimeout, the
// transaction rolls back, and the migration is tried again after a short
// random pause (logged through slog.Default with its version and the
// error's kind; MigrateLogged names another logger) until ctx ends, when
// the last lock error is returned. No statement_timeout is set: a data
// migration may rightly run for minutes, and ctx already bounds the whole
// run.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	return MigrateBefore(ctx, pool, "")
}

// MigrateLogged is Migrate with its retries logged to logger (the
// service's own log, in its format).
func MigrateLogged(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]string, error) {
	return migrate(ctx, pool, "", logger)
}

// MigrateBefore is Migrate for the migrations whose version sorts before
// version (all of them when version is ""): the schema an earlier release
// left, which upgrade tests start from.
func MigrateBefore(ctx context.Context, pool *pgxpool.Pool, version string) ([]string, error) {
	return migrate(ctx, pool, version, slog.Default())
}

func migrate(ctx context.Context, pool *pgxpool.Pool, version string, logger *slog.Logger) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: acquire: %w", err)
	}
	defer conn.Release()
	var versions []string
	for _, v := range embeddedVersions() {
		if version != "" && v >= version {
			break
		}
		versions = append(versions, v)
	}
	if recorded, err := allRecorded(ctx, conn, versions); err != nil || recorded {
		return nil, err
	}
	var applied []string
	for _, v := range versions {
		done, err := migrateRetrying(ctx, conn, v, logger)
		if err != nil {
			return applied, err
		}
		if done {
			applied = append(applied, v)
		}
	}
	return applied, nil
}

// allRecorded reports whether schema_migrations records every one of
// versions. That is what most starts find (every instance of a release
// migrates as it starts), and one read answers it: without it, each start
// would take the migration lock once per migration, each instance in
// turn, only to find every one of them recorded. False when the table does
// not exist yet. The statement is unnamed (pgx.QueryExecModeExec), as the
// migrations' are.
func allRecorded(ctx context.Context, conn *pgxpool.Conn, versions []string) (bool, error) {
	var missing bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM unnest($1::text[]) AS e(v)
		WHERE NOT EXISTS (SELECT 1 FROM schema_migrations m WHERE m.version = e.v))`,
		pgx.QueryExecModeExec, versions).Scan(&missing)
	switch {
	case IsPGUndefinedTable(err): // never migrated
		return false, nil
	case err != nil:
		return false, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	return !missing, nil
}

// embeddedVersions are the versions of the migrations built into the
// binary (their file names without .sql), in the order they apply.
func embeddedVersions() []string {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		panic(err) // only a malformed pattern fails, and this one is fixed
	}
	sort.Strings(names)
	for i, n := range names {
		names[i] = strings.TrimSuffix(strings.TrimPrefix(n, "migrations/"), ".sql")
	}
	return names
}

// MissingMigrations returns, in order, the migrations built into the binary
// that schema_migrations does not record: all of them when the table does
// not exist (the database was never migrated). It is one query, cheap
// enough for every start. Versions recorded that the binary does not know
// are no concern of it: a newer binary applied them, and a migration is
// written so that the binary of the release before it still runs on the
// schema it leaves (a rolling deploy runs both at once).
func MissingMigrations(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	versions := embeddedVersions()
	rows, err := pool.Query(ctx, `SELECT v FROM unnest($1::text[]) WITH ORDINALITY AS e(v, i)
		WHERE NOT EXISTS (SELECT 1 FROM schema_migrations m WHERE m.version = e.v) ORDER BY e.i`, versions)
	var missing []string
	if err == nil {
		missing, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	switch {
	case IsPGUndefinedTable(err): // never migrated
		return versions, nil
	case err != nil:
		return nil, fmt.Errorf("missing migrations: %w", err)
	}
	return missing, nil
}

// migrateRetrying runs migrateOne for version until it is applied or found
// recorded, trying again after a pause while it fails for want of a table
// lock (SQLSTATE 55P03: lock_timeout). Each attempt is a transaction of its
// own, rolled back on failure, so the migration is applied and recorded
// once whatever the number of attempts.
func migrateRetrying(ctx context.Context, conn *pgxpool.Conn, version string, logger *slog.Logger) (bool, error) {
	pause := migrationRetryFirst
	for attempt := 1; ; attempt++ {
		done, err := migrateOne(ctx, conn, "migrations/"+version+".sql", version)
		if !isLockNotAvailable(err) || ctx.Err() != nil {
			return done, err
		}
		wait := pause/2 + rand.N(pause/2+1)
		logger.Warn("migrate: a table the migration locks is in use; trying again",
			slog.String("version", version), slog.Int("attempt", attempt),
			slog.String("kind", Kind(err)), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, err
		case <-t.C:
		}
		pause = min(2*pause, migrationRetryMax)
	}
}

// isLockNotAvailable reports whether err is PostgreSQL's lock_timeout
// (55P03): the statement gave up waiting for a lock.
func isLockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == codeLockNotAvailable
}

// migrateOne applies one migration unless it is recorded already, all in
// one transaction under the migration lock. It reports whether it applied it.
//
// lock_timeout is set once the migration lock is held: waiting for that
// lock (another migrator at work) delays no query but the other
// migrators', while a wait for a table lock makes every new query on the
// table queue behind it.
func migrateOne(ctx context.Context, conn *pgxpool.Conn, name, version string) (bool, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgx.QueryExecModeExec, int64(migrationLockID)); err != nil {
		return false, fmt.Errorf("migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", migrationLockTimeout.Milliseconds())); err != nil {
		return false, fmt.Errorf("migrate: set lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return false, fmt.Errorf("migrate: create table: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version=$1)", pgx.QueryExecModeExec, version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migrate: check %s: %w", version, err)
	}
	if exists {
		return false, nil
	}
	sql, err := migrationFiles.ReadFile(name)
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, string(sql)); err != nil {
		return false, fmt.Errorf("migrate: apply %s: %w", version, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations(version) VALUES ($1)", pgx.QueryExecModeExec, version); err != nil {
		return false, fmt.Errorf("migrate: record %s: %w", version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate: commit %s: %w", version, err)
	}
	return true, nil
}
