package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// requestBudget is HAN_DB_REQUEST_TIMEOUT's default: what a request of the
// running release gives a query before it answers 503.
const requestBudget = 2 * time.Second

// The deploy runs the new release's hanctl migrate while the old instances
// serve. A long reader of dialog_members (pg_dump holds ACCESS SHARE on
// every table for its whole run) makes migration 0017's ALTER TABLE wait
// for ACCESS EXCLUSIVE, and every new query on the table queues behind
// that wait: the membership check of every send, history reads, listings.
// Each wait must give up well within a request's budget and be tried
// again, so requests go on answering; once the reader is gone the
// migration applies, and is recorded once.
func TestMigrateDoesNotQueueRequestsBehindItsDDL(t *testing.T) {
	ctx := context.Background()
	server := os.Getenv(testenv.ServerURLEnv)
	if server == "" {
		server = env.DatabaseURL
	}
	url, drop, err := testenv.CreateDatabase(ctx, server, "hanctl_lockq")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	pool, err := store.OpenPG(ctx, url, store.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.MigrateBefore(ctx, pool, "0017_dialog_members_created_at"); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	lock := testenv.LockTable(t, url, "dialog_members", "ACCESS SHARE")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := run(t, map[string]string{"DATABASE_URL": url}, "migrate", "--timeout", "60s")
		done <- result{out, err}
	}()
	var finished *result
	wait := func() result {
		if finished == nil {
			r := <-done
			finished = &r
		}
		return *finished
	}
	defer func() { lock.Release(); wait() }()

	reader, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	for attempt := 1; attempt <= 3; attempt++ {
		lock.WaitBlocked(1) // migrate's ALTER TABLE waits for the reader's lock
		rctx, cancel := context.WithTimeout(ctx, requestBudget)
		start := time.Now()
		var n int
		qerr := reader.QueryRow(rctx, "SELECT count(*) FROM dialog_members").Scan(&n)
		cancel()
		if qerr != nil {
			t.Fatalf("while hanctl migrate waited for dialog_members (attempt %d), a read of the table did not answer "+
				"within a request's budget of %s (waited %s, %v): every request touching the table stalls",
				attempt, requestBudget, time.Since(start).Round(time.Millisecond), qerr)
		}
		lock.WaitBlocked(0) // the attempt gave up its wait; migrate tries again
	}
	select {
	case r := <-done:
		finished = &r
		t.Fatalf("hanctl migrate ended while the table was held instead of trying again: %q %v", r.out, r.err)
	default:
	}

	lock.Release()
	r := wait()
	if r.err != nil || !strings.Contains(r.out, "0017_dialog_members_created_at") {
		t.Fatalf("hanctl migrate after the reader ended: %q %v", r.out, r.err)
	}
	check, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var recorded int
	var column bool
	if err := check.QueryRow(ctx, `SELECT (SELECT count(*) FROM schema_migrations WHERE version = '0017_dialog_members_created_at'),
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'dialog_members'::regclass AND attname = 'dialog_created_at' AND NOT attisdropped)`).
		Scan(&recorded, &column); err != nil {
		t.Fatal(err)
	}
	if recorded != 1 || !column {
		t.Fatalf("0017 recorded %d times, column added: %v", recorded, column)
	}
}
