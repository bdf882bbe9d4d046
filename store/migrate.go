package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockID is the advisory lock that serialises concurrent migrators
// (several instances starting at once).
const migrationLockID = 0x68616e6d6967 // "hanmig"

// Migrate applies every embedded migration not yet recorded in
// schema_migrations, each in its own transaction. It is idempotent and safe
// to run from several processes at once. It returns the versions applied.
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
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	return MigrateBefore(ctx, pool, "")
}

// MigrateBefore is Migrate for the migrations whose version sorts before
// version (all of them when version is ""): the schema an earlier release
// left, which upgrade tests start from.
func MigrateBefore(ctx context.Context, pool *pgxpool.Pool, version string) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: acquire: %w", err)
	}
	defer conn.Release()
	var applied []string
	for _, v := range embeddedVersions() {
		if version != "" && v >= version {
			break
		}
		done, err := migrateOne(ctx, conn, "migrations/"+v+".sql", v)
		if err != nil {
			return applied, err
		}
		if done {
			applied = append(applied, v)
		}
	}
	return applied, nil
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

// migrateOne applies one migration unless it is recorded already, all in
// one transaction under the migration lock. It reports whether it applied it.
func migrateOne(ctx context.Context, conn *pgxpool.Conn, name, version string) (bool, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgx.QueryExecModeExec, int64(migrationLockID)); err != nil {
		return false, fmt.Errorf("migrate: lock: %w", err)
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
