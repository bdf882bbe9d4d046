package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ServerURLEnv names the variable through which the test command hands one
// private PostgreSQL cluster to every package (a server-level URL; each
// package creates its own database in it).
const ServerURLEnv = "HAN_TEST_DATABASE_URL"

// PGCluster is a private PostgreSQL cluster started for tests or the local
// stack. It runs as the "postgres" system user when the caller is root,
// because PostgreSQL refuses to run as root.
//
// 127.0.0.1 is reachable by every account on the machine, and the superuser
// can run programs on the server (COPY ... TO PROGRAM): every connection,
// over TCP and over the unix socket (in Dir, mode 700), must prove a
// password (scram-sha-256) that is random per cluster and reaches initdb in
// a file of mode 600, never in a process's arguments.
type PGCluster struct {
	Dir  string // data directory (also holds the unix socket)
	Port int
	// URL is the server-level URL for the superuser "postgres", database
	// "postgres", password included: pass it in the environment, never as
	// an argument, and never print it.
	URL string

	bin       string
	runAs     *user.User // nil: run as the current user
	removeDir bool
}

// PGBinDir finds the directory holding initdb/pg_ctl: PATH first, then the
// newest Debian layout /usr/lib/postgresql/<v>/bin.
func PGBinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			if resolved, err := filepath.EvalSymlinks(p); err == nil {
				return filepath.Dir(resolved), nil
			}
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("testenv: PostgreSQL binaries (initdb, pg_ctl) not found; install the postgresql package")
}

func pgVersion(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// StartPGCluster creates and starts a fresh cluster in a new temporary
// directory outside /root, on a free loopback port, with a new random
// password for the superuser (see PGCluster).
func StartPGCluster() (*PGCluster, error) {
	bin, err := PGBinDir()
	if err != nil {
		return nil, err
	}
	c := &PGCluster{bin: bin, removeDir: true}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("testenv: running as root and no 'postgres' system user exists to run PostgreSQL")
		}
		c.runAs = u
	}
	base := os.Getenv("HAN_TEST_TMPDIR")
	if base == "" {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "han-pg-")
	if err != nil {
		return nil, fmt.Errorf("create pg dir: %w", err)
	}
	c.Dir = dir
	if err := c.chown(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	password := randHex(24)
	if err := c.initdb(data, password); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		c.Port = port
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 -c shared_buffers=64MB", port, dir)
		out, err := c.run("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start")
		if err == nil {
			u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password),
				Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres", RawQuery: "sslmode=disable"}
			c.URL = u.String()
			return c, nil
		}
		lastErr = fmt.Errorf("pg_ctl start: %w: %s", err, lastLines(out, 5))
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// initdb creates the cluster in data with password for the superuser
// postgres, required on every connection. The password file lives only
// while initdb runs.
func (c *PGCluster) initdb(data, password string) error {
	pwfile := filepath.Join(c.Dir, "initdb.pw")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return fmt.Errorf("write initdb password file: %w", err)
	}
	defer os.Remove(pwfile)
	if err := c.chown(pwfile); err != nil {
		return err
	}
	out, err := c.run("initdb", "-D", data, "--auth=scram-sha-256", "--pwfile="+pwfile, "-U", "postgres",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, lastLines(out, 5))
	}
	return nil
}

// Stop stops the cluster immediately and removes its directory.
func (c *PGCluster) Stop() {
	if c == nil {
		return
	}
	_, _ = c.run("pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-m", "immediate", "-w", "stop")
	if c.removeDir {
		os.RemoveAll(c.Dir)
	}
}

func (c *PGCluster) chown(path string) error {
	if c.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.runAs.Uid)
	gid, _ := strconv.Atoi(c.runAs.Gid)
	if err := os.Chown(path, uid, gid); err != nil {
		return fmt.Errorf("chown pg dir: %w", err)
	}
	return nil
}

func (c *PGCluster) run(tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(c.bin, tool), args...)
	cmd.Dir = c.Dir
	if c.runAs != nil {
		uid, _ := strconv.Atoi(c.runAs.Uid)
		gid, _ := strconv.Atoi(c.runAs.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(os.Environ(), "HOME="+c.Dir)
	}
	return cmd.CombinedOutput()
}

// CreateDatabase creates a uniquely named database in the server behind
// serverURL and returns its URL and a function that drops it.
func CreateDatabase(ctx context.Context, serverURL, prefix string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect test postgres: %w", err)
	}
	defer conn.Close(ctx)
	name := sanitizeDBName(prefix) + "_" + randHex(4)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return "", nil, err
	}
	dbURL := replaceDBName(serverURL, cfg.Database, name)
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	return dbURL, drop, nil
}

func replaceDBName(u, old, name string) string {
	q := ""
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u, q = u[:i], u[i:]
	}
	if old != "" && strings.HasSuffix(u, "/"+old) {
		return strings.TrimSuffix(u, old) + name + q
	}
	if i := strings.LastIndexByte(u, '/'); i > len("postgres://") {
		return u[:i+1] + name + q
	}
	return u + "/" + name + q
}

func sanitizeDBName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 40 {
		out = out[:40]
	}
	if out == "" {
		out = "han"
	}
	return out
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
