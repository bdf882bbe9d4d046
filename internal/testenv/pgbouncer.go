package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncerEnv, set to 1, makes Start put a private PgBouncer in transaction
// pooling mode in front of the package's PostgreSQL database: DatabaseURL
// then goes through the bouncer and DirectURL straight to PostgreSQL.
const PgBouncerEnv = "HAN_TEST_PGBOUNCER"

// PgBouncerExecModeEnv picks the pgx exec mode of the URLs handed out
// through the bouncer (default_query_exec_mode in the URL); unset: exec.
const PgBouncerExecModeEnv = "HAN_TEST_DB_EXEC_MODE"

// PgBouncerPoolSize is the server connections the bouncer keeps per
// database and user: fewer than a package's pools may open together, so
// client connections really share server connections, and enough that a
// test holding a few transactions open never starves the rest.
const PgBouncerPoolSize = 40

// PgBouncer is a private pgbouncer process in transaction pooling mode in
// front of one PostgreSQL server, on a free loopback port. When the caller
// is root it runs as the "postgres" system user, because Debian's pgbouncer
// refuses to run as root.
type PgBouncer struct {
	Dir  string // config, auth file and log; removed by Stop
	Port int

	cmd  *exec.Cmd
	done chan struct{}
}

// PgBouncerBin finds the pgbouncer binary: PATH, then Debian's /usr/sbin.
func PgBouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("testenv: pgbouncer not found; install the pgbouncer package (scripts/lib.sh: han_ensure_packages --pgbouncer)")
}

// StartPgBouncer starts a bouncer that forwards every database of the
// server behind serverURL (any database name: new test databases need no
// reload). Clients log in as the server's user with the URL's password
// (scram-sha-256): the loopback port is reachable by every account on the
// machine. Its auth file (mode 600) holds the user's SCRAM secret, read
// from pg_authid, with which the bouncer also logs in to the server for
// the client; the password itself when the URL's user cannot read
// pg_authid. A URL without a password (a shared server used on purpose
// that needs none) gets a bouncer that asks for none either.
func StartPgBouncer(serverURL string) (*PgBouncer, error) {
	bin, err := PgBouncerBin()
	if err != nil {
		return nil, err
	}
	su, err := url.Parse(serverURL)
	if err != nil || su.Port() == "" {
		return nil, errors.New("testenv: pgbouncer needs a server URL with host and port")
	}
	dbUser := su.User.Username()
	if dbUser == "" {
		dbUser = "postgres"
	}
	var runAs *user.User
	if os.Geteuid() == 0 {
		if runAs, err = user.Lookup("postgres"); err != nil {
			return nil, errors.New("testenv: running as root and no 'postgres' system user exists to run pgbouncer")
		}
	}
	base := os.Getenv("HAN_TEST_TMPDIR")
	if base == "" {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "han-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("create pgbouncer dir: %w", err)
	}
	b := &PgBouncer{Dir: dir}
	authType, secret, err := bouncerAuth(serverURL, su)
	if err != nil {
		b.Stop()
		return nil, err
	}
	authFile := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(authFile, []byte(authFileQuote(dbUser)+" "+authFileQuote(secret)+"\n"), 0o600); err != nil {
		b.Stop()
		return nil, err
	}
	if runAs != nil {
		uid, _ := strconv.Atoi(runAs.Uid)
		gid, _ := strconv.Atoi(runAs.Gid)
		for _, p := range []string{dir, authFile} {
			if err := os.Chown(p, uid, gid); err != nil {
				b.Stop()
				return nil, fmt.Errorf("chown pgbouncer dir: %w", err)
			}
		}
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if b.Port, err = FreePort(); err != nil {
			b.Stop()
			return nil, err
		}
		if lastErr = b.start(bin, runAs, su.Hostname(), su.Port(), authType, authFile); lastErr == nil {
			return b, nil
		}
	}
	b.Stop()
	return nil, lastErr
}

// bouncerAuth picks the bouncer's auth_type and the auth file's secret for
// the user of serverURL (see StartPgBouncer).
func bouncerAuth(serverURL string, su *url.URL) (authType, secret string, err error) {
	password, ok := su.User.Password()
	if !ok || password == "" {
		return "trust", "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", "", fmt.Errorf("connect test postgres for the bouncer's auth file: %w", err)
	}
	defer conn.Close(ctx)
	// Only a superuser reads pg_authid; anyone else keeps the password.
	if conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = current_user").Scan(&secret) == nil &&
		strings.HasPrefix(secret, "SCRAM-SHA-256$") {
		return "scram-sha-256", secret, nil
	}
	return "scram-sha-256", password, nil
}

// authFileQuote quotes s for pgbouncer's auth file, which doubles a quote
// inside a quoted field.
func authFileQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (b *PgBouncer) start(bin string, runAs *user.User, host, port, authType, authFile string) error {
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = %s
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 2000
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = %s
`, host, port, b.Port, authType, authFile, PgBouncerPoolSize, filepath.Join(b.Dir, "pgbouncer.log"))
	cfg := filepath.Join(b.Dir, "pgbouncer.ini")
	if err := os.WriteFile(cfg, []byte(ini), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(bin, cfg)
	cmd.Dir = b.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if runAs != nil {
		uid, _ := strconv.Atoi(runAs.Uid)
		gid, _ := strconv.Atoi(runAs.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	done, err := startServer(cmd, "pgbouncer", filepath.Join(b.Dir, "pgbouncer.log"), func() bool {
		c, err := net.DialTimeout("tcp", b.Addr(), 100*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if err != nil {
		return err
	}
	b.cmd, b.done = cmd, done
	return nil
}

// Pid is the bouncer's process id (its CPU time in benchmarks).
func (b *PgBouncer) Pid() int { return b.cmd.Process.Pid }

// Addr is host:port.
func (b *PgBouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.Port) }

// URL turns a direct URL of the server behind the bouncer into one through
// the bouncer (same user and database), with pgx's exec mode set to mode
// (default_query_exec_mode; empty: leave it as the URL has it).
func (b *PgBouncer) URL(direct, mode string) string {
	u, err := url.Parse(direct)
	if err != nil {
		return direct
	}
	u.Host = b.Addr()
	if mode != "" {
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// Stop kills the bouncer and removes its directory.
func (b *PgBouncer) Stop() {
	if b == nil {
		return
	}
	if b.cmd != nil {
		_ = b.cmd.Process.Kill()
		<-b.done
		b.cmd = nil
	}
	if strings.Contains(b.Dir, "han-pgbouncer-") {
		os.RemoveAll(b.Dir)
	}
}

// BouncerFor returns the PgBouncer in front of e's database: the harness's
// own under HAN_TEST_PGBOUNCER=1, else one started for this test and
// stopped when it ends. Without the pgbouncer binary the test is skipped,
// except under CI=true, where that is a failure.
func BouncerFor(t testing.TB, e *Env) *PgBouncer {
	t.Helper()
	if e.Bouncer != nil {
		return e.Bouncer
	}
	if _, err := PgBouncerBin(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	b, err := StartPgBouncer(e.DirectURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}
