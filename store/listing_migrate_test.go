package store_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// listingMigrations add the copy of each dialog's creation time to its
// memberships, then fill it in and build the listing's index.
var listingMigrations = []string{"0017_dialog_members_created_at.sql", "0018_dialog_listing_index.sql"}

// previousRelease opens a new database at the schema the release before
// the listing index left, with a user in three dialogs created as that
// release creates them (memberships without their dialog's creation time).
// It returns the database's URL, the user and the dialogs, newest first.
func previousRelease(t *testing.T, prefix string) (url, user string, dialogs []string) {
	t.Helper()
	ctx := context.Background()
	url, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	old, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := store.MigrateBefore(ctx, old, "0017"); err != nil {
		t.Fatal(err)
	}
	user, other := ids.New(), ids.New()
	if _, err := old.Exec(ctx, `INSERT INTO users(id) VALUES ($1), ($2)`, user, other); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		dialogs = append([]string{oldCreateDialog(t, old, user, other, time.Duration(3-i)*time.Hour)}, dialogs...)
	}
	return url, user, dialogs
}

// oldCreateDialog creates a dialog of user and other, age old, with the
// statements of the release before the listing index.
func oldCreateDialog(t *testing.T, pool *pgxpool.Pool, user, other string, age time.Duration) string {
	t.Helper()
	ctx := context.Background()
	id := ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO dialogs(id, title, created_by, created_at) VALUES ($1, '', $2, now() - $3::interval)`,
		id, user, age.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO dialog_members(dialog_id, user_id) SELECT $1, unnest($2::text[]::uuid[])",
		id, []string{user, other}); err != nil {
		t.Fatal(err)
	}
	return id
}

// checkListing fails unless every membership carries its dialog's creation
// time and the user's listing, one dialog a page, is want.
func checkListing(t *testing.T, pool *pgxpool.Pool, user string, want []string) {
	t.Helper()
	ctx := context.Background()
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dialog_members m JOIN dialogs d ON d.id = m.dialog_id
		WHERE m.dialog_created_at IS DISTINCT FROM d.created_at`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d memberships without their dialog's creation time (%v)", wrong, err)
	}
	st := store.New(pool)
	var got []string
	cursor := ""
	for {
		page, next, err := st.ListDialogs(ctx, user, cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page {
			got = append(got, d.ID)
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("listing %v, want %v", got, want)
	}
}

// Upgrading a database the previous release wrote: the migration fills in
// the existing memberships; a membership the previous release inserts
// afterwards (it keeps serving during a rolling upgrade) is filled in by
// the trigger; the listing lists them all newest first; the migration run
// again changes nothing and fails on nothing.
func TestListingMigrationUpgradesAServedDatabase(t *testing.T) {
	ctx := context.Background()
	url, user, dialogs := previousRelease(t, "store_listing_upgrade")
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	checkListing(t, pool, user, dialogs)
	var other string
	if err := pool.QueryRow(ctx, `SELECT user_id::text FROM dialog_members WHERE dialog_id = $1 AND user_id <> $2`,
		dialogs[0], user).Scan(&other); err != nil {
		t.Fatal(err)
	}
	dialogs = append([]string{oldCreateDialog(t, pool, user, other, 0)}, dialogs...)
	checkListing(t, pool, user, dialogs)

	var tag string
	for _, m := range listingMigrations {
		sql, err := store.MigrationSQL(m)
		if err != nil {
			t.Fatal(err)
		}
		res, err := pool.Exec(ctx, sql)
		if err != nil {
			t.Fatalf("the migration %s run again: %v", m, err)
		}
		tag += res.String() + " "
	}
	var triggers, indexes int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'dialog_members'::regclass AND NOT tgisinternal),
		(SELECT count(*) FROM pg_index WHERE indrelid = 'dialog_members'::regclass AND indisvalid)`).Scan(&triggers, &indexes); err != nil {
		t.Fatal(err)
	}
	if triggers != 1 || indexes != 3 {
		t.Fatalf("after the migration ran again (%s): %d triggers, %d valid indexes on dialog_members", tag, triggers, indexes)
	}
	checkListing(t, pool, user, dialogs)
}

// On a large dialog_members the runbook's steps do the migration's work by
// hand while the previous release serves. Its statements, as
// docs/runbook-postgres.md gives them, each in its own transaction: then
// the upgrade's migration takes no lock that stops a membership insert
// (here one left open while it runs), and the listing lists every dialog.
func TestListingMigrationAfterTheRunbookStepsLetsInsertsRun(t *testing.T) {
	ctx := context.Background()
	url, user, dialogs := previousRelease(t, "store_listing_runbook")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var other string
	if err := conn.QueryRow(ctx, `SELECT user_id::text FROM dialog_members WHERE dialog_id = $1 AND user_id <> $2`,
		dialogs[0], user).Scan(&other); err != nil {
		t.Fatal(err)
	}
	// Enough other dialogs for several batches of the backfill.
	if _, err := conn.Exec(ctx, `WITH d AS (INSERT INTO dialogs(id, created_by, created_at)
			SELECT gen_random_uuid(), $1, now() - g * interval '1 second' FROM generate_series(1, 2500) g RETURNING id)
		INSERT INTO dialog_members(dialog_id, user_id) SELECT id, $1 FROM d`, other); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range runbookListingSteps(t) {
		if _, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil { // as psql sends it
			t.Fatalf("runbook step %q: %v", stmt, err)
		}
	}
	var unfilled int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM dialog_members WHERE dialog_created_at IS NULL`).Scan(&unfilled); err != nil || unfilled != 0 {
		t.Fatalf("after the runbook's backfill %d memberships have no creation time (%v)", unfilled, err)
	}
	// The previous release creates a dialog; its transaction is still open
	// while the migration runs.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	id := ids.New()
	if _, err := tx.Exec(ctx, `INSERT INTO dialogs(id, title, created_by) VALUES ($1, '', $2)`, id, user); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO dialog_members(dialog_id, user_id) SELECT $1, unnest($2::text[]::uuid[])",
		id, []string{user, other}); err != nil {
		t.Fatal(err)
	}
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := store.Migrate(mctx, pool); err != nil {
		t.Fatalf("the migration after the runbook's steps, beside an open membership insert: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	checkListing(t, pool, user, append([]string{id}, dialogs...))
}

// The listing index's own migration (the backfill and the index build)
// never holds dialog_members exclusively: a transaction that has read the
// table and stays open (a listing, a membership check) does not stop it.
// Only the column's migration before it takes the table for a moment.
func TestListingBackfillLetsReadsRun(t *testing.T) {
	ctx := context.Background()
	url, user, dialogs := previousRelease(t, "store_listing_reads")
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.MigrateBefore(ctx, pool, "0018"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM dialog_members WHERE user_id = $1`, user).Scan(&n); err != nil || n != len(dialogs) {
		t.Fatalf("the reader's count: %d, %v", n, err)
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := store.Migrate(mctx, pool); err != nil {
		t.Fatalf("the backfill and index build beside an open reader: %v", err)
	}
	checkListing(t, pool, user, dialogs)
}

// runbookListingSteps reads the SQL of the runbook's "Dialog listing
// index" section: statements separated by blank lines.
func runbookListingSteps(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../docs/runbook-postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(raw), "## Dialog listing index\n")
	_, block, ok2 := strings.Cut(sec, "```sql\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal(`docs/runbook-postgres.md has no SQL block under "Dialog listing index"`)
	}
	steps := strings.Split(strings.TrimSpace(block), "\n\n")
	if len(steps) != 5 {
		t.Fatalf("the runbook's block has %d statements, the test knows 5", len(steps))
	}
	return steps
}
