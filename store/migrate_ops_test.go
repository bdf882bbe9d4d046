package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// A request that reuses an expired idempotency key rewrites the record in
// place. When the janitor's DELETE found the old row and waits for its
// lock, it must not delete the live record once the request commits: a
// retry within the new TTL would run the request again.
func TestJanitorKeepsARecordRefreshedDuringThePurge(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	k := store.IdemKey{Scope: "janitor_refresh", UserID: ids.New(), KeyHMAC: "k" + strings.ReplaceAll(ids.New(), "-", "")}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records (scope, user_id, key_hmac, fingerprint, status, expires_at)
		VALUES ($1, $2, $3, 'old', 201, now() - interval '1 minute')`, k.Scope, k.UserID, k.KeyHMAC); err != nil {
		t.Fatal(err)
	}
	// A retry with the same key after the TTL: its business transaction
	// replaces the expired record and has not committed yet.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := store.InsertIdempotencyTx(ctx, tx, k, store.IdemRecord{Fingerprint: "new", Status: 201, ResourceID: "r1", Version: 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.PurgeExpiredIdempotency(ctx, 1000)
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'DELETE FROM idempotency_records%'`).Scan(&n)
		return n > 0
	}, "the janitor's DELETE never waited for the row lock")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec, found, err := st.LookupIdempotency(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_records WHERE scope=$1 AND user_id=$2 AND key_hmac=$3`,
			k.Scope, k.UserID, k.KeyHMAC).Scan(&n)
		t.Fatalf("the janitor deleted the live record written over the expired one (rows left with the key: %d); "+
			"a retry within the TTL would run the request again", n)
	}
	if rec.Fingerprint != "new" {
		t.Fatalf("record: %+v", rec)
	}
}

// Migrate may run through PgBouncer in transaction pooling (DATABASE_URL
// without HAN_DATABASE_DIRECT_URL), on a pool in pgx's default exec mode:
// the second migrator (another instance, or the gateway after hanctl
// migrate) reaches the server connection the first one used and must not
// meet its prepared statements there.
func TestMigrateTwiceThroughPgBouncer(t *testing.T) {
	b := testenv.BouncerFor(t, env)
	ctx := context.Background()
	direct, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "store_bouncer_migrate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	for i := 1; i <= 2; i++ {
		pool, err := store.OpenPG(ctx, b.URL(direct, ""), store.PGConfig{MaxConns: 1, MinConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = store.Migrate(ctx, pool)
		pool.Close()
		if err != nil {
			t.Fatalf("migrator #%d through PgBouncer: %v", i, err)
		}
	}
}

// On a large outbox the runbook builds outbox_delivered_idx by hand with
// CREATE INDEX CONCURRENTLY before upgrading. A concurrent build that was
// cut short leaves an INVALID index under the name, which the migration's
// CREATE INDEX IF NOT EXISTS takes as done and PostgreSQL never uses: the
// migrations rebuild it, so the purge has its index.
func TestAnInvalidOutboxIndexIsRebuilt(t *testing.T) {
	ctx := context.Background()
	direct, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "store_invalid_outbox_idx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The database of the previous release: migrations up to 0005.
	old, err := store.OpenPG(ctx, direct, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := store.MigrateBefore(ctx, old, "0006"); err != nil {
		t.Fatal(err)
	}
	// The operator's concurrent build is cut short (here by a
	// statement_timeout while an open transaction that wrote to the outbox
	// makes it wait).
	other, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	otx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otx.Exec(ctx, `INSERT INTO outbox (event_id, channel, payload) VALUES ($1, 'c', '\x')`, ids.New()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET statement_timeout = '300ms'"); err != nil {
		t.Fatal(err)
	}
	_, cicErr := conn.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_delivered_idx ON outbox (delivered_at) WHERE delivered_at IS NOT NULL`)
	_ = otx.Rollback(ctx)
	if cicErr == nil {
		t.Fatal("the concurrent build was not cut short: the test does not show what it means to")
	}
	var valid bool
	if err := conn.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_delivered_idx'::regclass`).Scan(&valid); err != nil || valid {
		t.Fatalf("no invalid index left (valid=%v, %v): the test does not show what it means to", valid, err)
	}
	pool, err := store.OpenPG(ctx, direct, store.PGConfig{MaxConns: 1, MinConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_delivered_idx'::regclass`).Scan(&valid); err != nil {
		t.Fatal(err)
	}
	if !valid {
		t.Fatalf("migrations %v applied, but outbox_delivered_idx is still invalid: the purge has no usable index", applied)
	}
}
