package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The dev stack's PostgreSQL listens on 127.0.0.1, which every account on
// the machine reaches, and a TCP connection carries no OS identity: without
// a password any of them would connect as the superuser postgres, read and
// rewrite the stack's data and run programs as the account PostgreSQL runs
// under (COPY TO PROGRAM). So the superuser needs its password over TCP; the
// URL the stack hands out carries it (the stack comes up, migrates and seeds
// with it), the password shows in no process's arguments nor in the banner,
// and a cluster an older dev.sh initialised with trust auth is closed at the
// next start. It builds bin/ and starts the stack twice: skipped with -short.
func TestDevScriptPostgresRefusesAPasswordlessSuperuser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole dev stack")
	}
	d := newDevStack(t)
	t.Cleanup(func() { _, _ = d.stop() })

	dbURL, devLog := startDevStack(t, d, "dev.log")
	pw := checkDevPostgresAuth(t, dbURL)
	if strings.Contains(devLog(), pw) {
		t.Errorf("dev.sh printed the PostgreSQL password")
	}
	if fi, err := os.Stat(filepath.Join(d.data, "run", "stack.env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("run/stack.env holds the password: want mode 600, got %v (%v)", fi.Mode().Perm(), err)
	}
	secrets, err := os.ReadFile(filepath.Join(d.data, "secrets.env"))
	if err != nil || !strings.Contains(string(secrets), "\nHAN_DEV_PG_PASSWORD="+pw+"\n") {
		t.Fatalf("secrets.env lacks HAN_DEV_PG_PASSWORD (%v)", err)
	}
	out, err := d.script(`eval "$(scripts/dev.sh --env)" && printf '%s\n' "$DATABASE_URL"`).Output()
	if err != nil || strings.TrimSpace(string(out)) != dbURL {
		t.Errorf("dev.sh --env: DATABASE_URL differs from stack.env's (%v)", err)
	}
	if out, err := d.stop(); err != nil {
		t.Fatalf("dev.sh --stop: %v %s", err, out)
	}

	// What an older dev.sh left: initdb -A trust's pg_hba.conf, and a
	// secrets.env without a PostgreSQL password.
	pgBase := filepath.Join(d.data, "pg")
	if b, err := os.ReadFile(filepath.Join(d.data, "pg.location")); err == nil {
		pgBase = strings.TrimSpace(string(b))
	}
	hba := filepath.Join(pgBase, "data", "pg_hba.conf")
	trust := "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
	if err := os.WriteFile(hba, []byte(trust), 0o600); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(secrets), "\n") {
		if !strings.HasPrefix(l, "HAN_DEV_PG_PASSWORD=") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(filepath.Join(d.data, "secrets.env"), []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL, _ = startDevStack(t, d, "dev-again.log")
	if checkDevPostgresAuth(t, dbURL) == pw {
		t.Errorf("no new password generated for a secrets.env without one")
	}
}

// startDevStack starts scripts/dev.sh in the background and waits until it
// wrote run/stack.env; it returns that file's DATABASE_URL and the log.
func startDevStack(t *testing.T, d *devStack, logName string) (string, func() string) {
	t.Helper()
	log := filepath.Join(d.data, logName)
	if out, err := d.script("scripts/dev.sh </dev/null >" + log + " 2>&1 &").CombinedOutput(); err != nil {
		t.Fatalf("start: %v %s", err, out)
	}
	devLog := func() string { b, _ := os.ReadFile(log); return string(b) }
	deadline := time.Now().Add(8 * time.Minute)
	for {
		if fi, err := os.Stat(filepath.Join(d.data, "run", "stack.env")); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) || strings.Contains(devLog(), "error:") {
			t.Fatalf("the dev stack did not come up:\n%s", devLog())
		}
		time.Sleep(500 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(d.data, "run", "stack.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "DATABASE_URL="); ok {
			return strings.Trim(v, "'"), devLog
		}
	}
	t.Fatalf("no DATABASE_URL in stack.env")
	return "", nil
}

// checkDevPostgresAuth: the stack's URL connects; the same URL without its
// password (what a neighbouring account can type) is refused; the password
// is in no process's arguments. It returns the password.
func checkDevPostgresAuth(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("DATABASE_URL does not parse: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bare := *u
	bare.User = url.User(u.User.Username())
	cfg, err := pgx.ParseConfig(bare.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Password = "" // neither PGPASSWORD nor a passfile of the test's account
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		// Where the account PostgreSQL runs under may write.
		proof := filepath.Join(os.TempDir(), fmt.Sprintf("devpg-copy-to-program-%d", os.Getpid()))
		defer os.Remove(proof)
		var super bool
		_ = conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super)
		_, copyErr := conn.Exec(ctx, "COPY (SELECT 1) TO PROGRAM 'id > "+proof+"'")
		got, _ := os.ReadFile(proof)
		conn.Close(ctx)
		t.Fatalf("the dev stack's PostgreSQL (%s) accepts a password-less connection (superuser %v); COPY TO PROGRAM: err=%v, ran %q",
			u.Host, super, copyErr, strings.TrimSpace(string(got)))
	}

	pw, ok := u.User.Password()
	if !ok || len(pw) < 32 {
		t.Fatalf("DATABASE_URL carries no password (user %q, %d characters)", u.User.Username(), len(pw))
	}
	conn, err = pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("the stack's own DATABASE_URL does not connect: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n == 0 {
		t.Errorf("schema_migrations through DATABASE_URL: %d rows, %v", n, err)
	}
	conn.Close(ctx)

	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), pw) {
			exe, _ := os.Readlink(filepath.Join(filepath.Dir(f), "exe"))
			t.Errorf("the PostgreSQL password is in the arguments of %s (%s)", filepath.Dir(f), exe)
		}
	}
	return pw
}
