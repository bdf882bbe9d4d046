package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// newestMigration is the version of the last migration built into the
// binary (the last file of store/migrations).
func newestMigration(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("../../store/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("store/migrations: %v %v", files, err)
	}
	sort.Strings(files)
	return strings.TrimSuffix(filepath.Base(files[len(files)-1]), ".sql")
}

// quietMain is a Main configured by vars and args whose log is discarded.
func quietMain(t *testing.T, vars map[string]string, args ...string) *Main {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(args, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	return m
}

// A binary started without migrating (-migrate=false) on a database that
// lacks a migration it was built with refuses to start: it exits 1 with a
// log line naming the missing version and how to apply it, and never
// listens, so /readyz never answers ready. Once the migration is applied
// it starts; a migration recorded that the binary does not know (a newer
// binary ran it during a rolling deploy) does not stop it.
func TestStartRefusedOnASchemaOlderThanTheBinary(t *testing.T) {
	ctx := context.Background()
	db, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "han_gw_schema_behind")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	pool, err := store.OpenPG(ctx, db, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	newest := newestMigration(t)
	if _, err := store.MigrateBefore(ctx, pool, newest); err != nil {
		t.Fatal(err)
	}
	vars := baseEnv()
	vars["DATABASE_URL"] = db

	// The real program: exit status 1, the missing version and the way to
	// apply it in its log, nothing served.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A program that starts serves until it is killed: a minute is ample
	// for a refusal.
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(pctx, exe, "-migrate=false")
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "TMPDIR=" + os.TempDir()}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("start on a schema without %s: %v, want exit status 1\n%s", newest, err, out)
	}
	logged := false
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) && strings.Contains(l, newest) && strings.Contains(l, "hanctl migrate") {
			logged = true
		}
	}
	if !logged || strings.Contains(string(out), `"msg":"serving"`) {
		t.Fatalf("want one error line naming %s and hanctl migrate, and no serving line:\n%s", newest, out)
	}

	// Main itself: Run refuses before it listens.
	m := quietMain(t, vars, "-migrate=false")
	err = m.Run(ctx)
	_ = m.Close()
	if err == nil || !strings.Contains(err.Error(), newest) || m.Addr() != "" {
		t.Fatalf("Run on a schema without %s: %v (listening on %q)", newest, err, m.Addr())
	}

	// Fully migrated: it starts and is ready.
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ready := func() {
		t.Helper()
		m := quietMain(t, vars, "-migrate=false")
		if err := m.Run(ctx); err != nil {
			t.Fatalf("start on a migrated schema: %v", err)
		}
		defer m.Close()
		if code, body := call(t, "GET", m.URL()+"/readyz", "", ""); code != 200 {
			t.Fatalf("/readyz: %d %s", code, body)
		}
	}
	ready()

	// A migration of a newer binary, unknown to this one.
	if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations(version) VALUES ('9999_of_a_newer_binary')"); err != nil {
		t.Fatal(err)
	}
	ready()
}

// A database the migrations never ran on (no schema_migrations at all) is
// refused the same way, naming the first migration; and so is a start that
// migrated over HAN_DATABASE_DIRECT_URL when DATABASE_URL names another
// database, which never got them.
func TestStartRefusedOnAnUnmigratedDatabase(t *testing.T) {
	ctx := context.Background()
	fresh := func() string {
		u, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "han_gw_schema_none")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(drop)
		return u
	}
	served, direct := fresh(), fresh()
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"without migrating":          {[]string{"-migrate=false"}, "hanctl migrate"},
		"migrating another database": {nil, "HAN_DATABASE_DIRECT_URL"},
	} {
		vars := baseEnv()
		vars["DATABASE_URL"], vars["HAN_DATABASE_DIRECT_URL"] = served, direct
		m := quietMain(t, vars, c.args...)
		err := m.Run(ctx)
		_ = m.Close()
		if err == nil || !strings.Contains(err.Error(), "0001_init") || !strings.Contains(err.Error(), c.want) || m.Addr() != "" {
			t.Errorf("%s: Run %v (listening on %q)", name, err, m.Addr())
		}
	}
}
