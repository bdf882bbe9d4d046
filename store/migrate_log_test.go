package store_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The gateway migrates at start with its own JSON log: a migration that
// waits for a table in use says so in that log (one JSON line per retry,
// with its version and the error's kind), not as plain text beside it.
func TestMigrationRetriesGoToTheCallersLog(t *testing.T) {
	ctx := context.Background()
	url, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "store_migrate_log")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.MigrateBefore(ctx, pool, "0017"); err != nil {
		t.Fatal(err)
	}
	lock := testenv.LockTable(t, url, "dialog_members", "ACCESS SHARE")
	var out testenv.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&out, nil))
	type result struct {
		applied []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		applied, err := store.MigrateLogged(mctx, pool, logger)
		done <- result{applied, err}
	}()
	testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(out.String(), "trying again") },
		"no retry logged while the table was held; log: %q", out.String())
	lock.Release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.applied) == 0 || !strings.HasPrefix(r.applied[0], "0017") {
		t.Fatalf("applied %v, want 0017 first", r.applied)
	}
	line, _, _ := strings.Cut(out.String(), "\n")
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("the retry is not a JSON line of the caller's log: %q", line)
	}
	if v, _ := rec["version"].(string); !strings.HasPrefix(v, "0017") || rec["kind"] != "pg_busy" {
		t.Fatalf("retry line %v, want version 0017… and kind pg_busy", rec)
	}
}
