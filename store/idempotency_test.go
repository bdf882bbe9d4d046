package store_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

func insertIdem(t *testing.T, pool *pgxpool.Pool, k store.IdemKey, rec store.IdemRecord, ttl time.Duration) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return store.InsertIdempotencyTx(context.Background(), tx, k, rec, ttl)
	})
}

func TestIdempotencyRecordsInPostgres(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	user := ids.New()
	if err := st.EnsureUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	k := store.IdemKey{Scope: "msg_send", UserID: user, KeyHMAC: "aa"}
	rec := store.IdemRecord{Fingerprint: "fp1", Status: 201, ResourceID: "r1", Version: 3, Meta: `{"x":1}`}
	if err := insertIdem(t, pool, k, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, found, err := st.LookupIdempotency(ctx, k)
	if err != nil || !found || got.Fingerprint != "fp1" || got.Status != 201 || got.ResourceID != "r1" || got.Version != 3 {
		t.Fatalf("lookup: %+v %v %v", got, found, err)
	}
	// A live record wins: the business transaction must roll back.
	if err := insertIdem(t, pool, k, store.IdemRecord{Fingerprint: "fp2", Status: 201}, time.Hour); !errors.Is(err, store.ErrIdemExists) {
		t.Fatalf("second insert over a live row: %v", err)
	}
	// An expired record is ignored by lookups and replaced by inserts.
	k2 := store.IdemKey{Scope: "msg_send", UserID: user, KeyHMAC: "bb"}
	if err := insertIdem(t, pool, k2, store.IdemRecord{Fingerprint: "old", Status: 201}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, func() bool {
		_, found, err := st.LookupIdempotency(ctx, k2)
		return err == nil && !found
	}, "an expired record is still found")
	if err := insertIdem(t, pool, k2, store.IdemRecord{Fingerprint: "new", Status: 201}, time.Hour); err != nil {
		t.Fatalf("insert over an expired row: %v", err)
	}
	if got, found, _ := st.LookupIdempotency(ctx, k2); !found || got.Fingerprint != "new" {
		t.Fatalf("the expired row was not replaced: %+v", got)
	}
}

// The durable lookup is a request statement: behind a lock held elsewhere
// (a migration, a VACUUM FULL) it returns database_busy within the request
// budget instead of holding its request, whose context has no deadline,
// for as long as the lock is held; once the lock goes it answers again.
func TestIdempotencyLookupBehindALockIsBusyWithinTheBudget(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	user := ids.New()
	if err := st.EnsureUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	k := store.IdemKey{Scope: "msg_send", UserID: user, KeyHMAC: "locked"}
	if err := insertIdem(t, pool, k, store.IdemRecord{Fingerprint: "fp", Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	st.SetRequestTimeout(300 * time.Millisecond)
	lock := testenv.LockTable(t, env.DatabaseURL, "idempotency_records", "ACCESS EXCLUSIVE")
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, _, err := st.LookupIdempotency(ctx, k)
		done <- err
	}()
	select {
	case err := <-done:
		if took := time.Since(start); !errors.Is(err, store.ErrDatabaseBusy) || took > 3*time.Second {
			t.Fatalf("a lookup behind the lock: %v after %v, want database_busy within the budget", err, took)
		}
	case <-time.After(10 * time.Second):
		lock.Release()
		t.Fatal("a lookup behind the lock still waits after 10 s (request budget 300 ms)")
	}
	lock.Release()
	if rec, found, err := st.LookupIdempotency(ctx, k); err != nil || !found || rec.Fingerprint != "fp" {
		t.Fatalf("a lookup after the lock: %+v %v %v", rec, found, err)
	}
}

func TestJanitorPurgesExpiredRecordsInBatches(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	user := ids.New()
	if err := st.EnsureUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records(scope, user_id, key_hmac, fingerprint, status, expires_at)
		SELECT 'janitor', $1, 'old' || g, 'f', 201, now() - interval '1 minute' FROM generate_series(1, 7) g`, user); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records(scope, user_id, key_hmac, fingerprint, status, expires_at)
		VALUES ('janitor', $1, 'live', 'f', 201, now() + interval '1 hour')`, user); err != nil {
		t.Fatal(err)
	}
	count := func() (expired, live int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE expires_at <= now()), count(*) FILTER (WHERE expires_at > now())
			FROM idempotency_records WHERE scope='janitor'`).Scan(&expired, &live); err != nil {
			t.Fatal(err)
		}
		return
	}
	j := store.NewJanitor(st, store.JanitorConfig{Interval: time.Hour, Batch: 3}, nil)
	// Start runs once right away, in batches of 3, until nothing is left.
	j.Start()
	testenv.Eventually(t, 5*time.Second, func() bool { e, _ := count(); return e == 0 }, "expired rows were not purged")
	j.Close()
	j.Close() // idempotent
	if _, live := count(); live != 1 {
		t.Fatalf("the janitor removed a live record (%d left)", live)
	}
	// Purge reports what it removed.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE scope='janitor'`); err != nil {
		t.Fatal(err)
	}
	if n, err := st.PurgeExpiredIdempotency(ctx, 1); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	// A janitor never started closes at once.
	store.NewJanitor(st, store.JanitorConfig{}, nil).Close()
}

func TestRedisHealthFailsFastAndRecovers(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	rdb, err := rds.NewRedis(r.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	changes := make(chan bool, 4)
	h := rds.NewRedisHealth(rdb, rds.HealthConfig{ProbeInterval: 20 * time.Millisecond, OnChange: func(down bool) { changes <- down }}, nil)
	defer h.Close()
	ctx := context.Background()
	if err := h.Ping(ctx); err != nil || h.Down() {
		t.Fatalf("healthy ping: %v", err)
	}
	// Answers from a live server (OOM, NOPERM, script errors) never mark it down.
	for _, e := range []error{errors.New("OOM command not allowed when used memory > 'maxmemory'"), errors.New("NOPERM this user has no permissions")} {
		if h.Observe(e); h.Down() {
			t.Fatalf("%v marked Redis down", e)
		}
	}
	r.Kill()
	if err := h.Ping(ctx); !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("ping of a killed server: %v", err)
	}
	if !h.Down() || !<-changes {
		t.Fatal("not marked down")
	}
	if err := h.Check(); !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("check while down: %v", err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !h.Down() }, "the prober did not bring Redis back")
	if <-changes {
		t.Fatal("second change should be up")
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestLocalBlobs(t *testing.T) {
	b, err := store.NewLocalBlobs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Put(ctx, "ab/0123-x", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	f, err := b.Open(ctx, "ab/0123-x")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != "hello" {
		t.Fatalf("read back %q", got)
	}
	// A failed Put leaves nothing behind, not even a partial blob.
	if _, err := b.Put(ctx, "ab/partial", io.MultiReader(strings.NewReader("half"), errReader{})); err == nil {
		t.Fatal("Put should fail")
	}
	if _, err := b.Open(ctx, "ab/partial"); !errors.Is(err, store.ErrBlobNotFound) {
		t.Fatalf("partial blob visible: %v", err)
	}
	for _, bad := range []string{"../x", "a/../../x", "/abs", "A", "a//b", ""} {
		if _, err := b.Put(ctx, bad, bytes.NewReader(nil)); err == nil {
			t.Errorf("key %q accepted", bad)
		}
	}
	if err := b.Delete(ctx, "ab/0123-x"); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "ab/0123-x"); err != nil {
		t.Fatalf("deleting an absent blob: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }
