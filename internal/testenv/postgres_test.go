package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// withoutPassword is raw with the user but no password.
func withoutPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(u.User.Username())
	return u.String()
}

// withPassword is raw with password instead of its own.
func withPassword(t *testing.T, raw, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// refused asserts that the server (not the network) turns a connection
// to connString away.
func refused(t *testing.T, what, connString string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err == nil {
		conn.Close(ctx)
		t.Fatalf("%s: connected without the password", what)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("%s: want the server to refuse the login, got %v", what, err)
	}
}

// connects asserts that connString logs in and runs a query.
func connects(t *testing.T, what, connString string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("%s: SELECT 1 = %d, %v", what, one, err)
	}
}

// Every local account reaches 127.0.0.1, and the cluster's superuser can run
// programs on the server: the private cluster (and a bouncer in front of
// it) lets in only who has its password, over TCP and the unix socket.
func TestPrivateClusterRequiresItsPassword(t *testing.T) {
	c, err := StartPGCluster()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	refused(t, "TCP without a password", withoutPassword(t, c.URL))
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	password, ok := u.User.Password()
	if !ok || len(password) < 32 {
		t.Fatalf("the cluster's URL carries no password of at least 32 characters (%d)", len(password))
	}

	connects(t, "the cluster's URL", c.URL)
	refused(t, "TCP with another password", withPassword(t, c.URL, "not-"+password))
	refused(t, "the unix socket without a password",
		fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", c.Dir, c.Port))

	if fi, err := os.Stat(c.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the socket's directory: %v, %v; want mode 700", fi.Mode(), err)
	}
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), password) {
			t.Fatalf("%s holds the password after the start", filepath.Base(f))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, drop, err := CreateDatabase(ctx, c.URL, "testenv_auth")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	connects(t, "a package database's URL", db)
	refused(t, "a package database without a password", withoutPassword(t, db))

	t.Run("pgbouncer", func(t *testing.T) {
		if _, err := PgBouncerBin(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
		b, err := StartPgBouncer(c.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop()
		connects(t, "through the bouncer", b.URL(db, "exec"))
		refused(t, "the bouncer without a password", withoutPassword(t, b.URL(db, "exec")))
		refused(t, "the bouncer with another password", withPassword(t, b.URL(db, "exec"), "not-"+password))
		auth, err := os.ReadFile(filepath.Join(b.Dir, "users.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(auth), password) || !strings.Contains(string(auth), "SCRAM-SHA-256$") {
			t.Fatal("the bouncer's auth file holds the password rather than the SCRAM secret")
		}
	})
}
