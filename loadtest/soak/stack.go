package soak

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/store/rds"
)

// adminUser is the unrestricted ACL user only the soak's fault injector and
// checker use; the gateways connect as rds.APIBackendUser.
const adminUser = "han_soak_admin"

// StackConfig configures the local stack a soak drives.
type StackConfig struct {
	// BinDir holds han-gateway.
	BinDir string
	// Dir is an empty working directory (Redis AOF, PostgreSQL data, logs).
	Dir string
	// LivenessTTL is HAN_INSTANCE_LIVENESS_TTL of both gateways: a killed
	// instance's idempotency locks and presence are taken over within it.
	LivenessTTL time.Duration
}

// Stack is two gateway instances on one private redis-server (the rendered
// ACL, AOF on) reached through a fault proxy, and one private PostgreSQL.
// Every process is a child of the soak with a parent-death signal, so none
// outlives it. Methods are safe for concurrent use.
type Stack struct {
	cfg   StackConfig
	Redis *proc
	PG    *proc
	Proxy *faultproxy.Proxy
	GW    [2]*proc

	RedisPort, PGPort int
	GWAddr            [2]string
	DevSecret         string
	DatabaseURL       string
	apiPassword       string
	adminPassword     string
}

// proc is one restartable child process.
type proc struct {
	name  string
	args  func() *exec.Cmd
	ready func(ctx context.Context) error

	mu   sync.Mutex // guards cmd, done
	cmd  *exec.Cmd
	done chan struct{}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartStack starts Redis, PostgreSQL and both gateways.
func StartStack(ctx context.Context, cfg StackConfig) (*Stack, error) {
	s := &Stack{cfg: cfg, DevSecret: "soak-dev-" + randomHex(16), apiPassword: "api-" + randomHex(12), adminPassword: "admin-" + randomHex(12)}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	if err := s.startRedis(ctx); err != nil {
		return nil, err
	}
	p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", s.RedisPort))
	if err != nil {
		return nil, err
	}
	s.Proxy = p
	if err := s.startPG(ctx); err != nil {
		return nil, err
	}
	for i := range s.GW {
		if err := s.startGateway(ctx, i); err != nil {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

func (s *Stack) startRedis(ctx context.Context) error {
	dir := filepath.Join(s.cfg.Dir, "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	acl := rds.RenderACL(rds.ACLOptions{APIBackendPassword: s.apiPassword,
		Extra: []string{fmt.Sprintf("user %s on >%s ~* &* +@all", adminUser, s.adminPassword)}})
	if err := os.WriteFile(filepath.Join(dir, "users.acl"), []byte(acl), 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	s.RedisPort = port
	s.Redis = &proc{name: "redis", args: func() *exec.Cmd {
		// The production settings that matter under faults (deploy/redis.conf):
		// AOF fsynced every second, volatile-lru eviction.
		return exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--aclfile", filepath.Join(dir, "users.acl"), "--save", "", "--daemonize", "no",
			"--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "volatile-lru",
			"--logfile", filepath.Join(dir, "redis.log"))
	}, ready: func(ctx context.Context) error {
		c := s.AdminRedis(0)
		defer c.Close()
		return c.Ping(ctx).Err()
	}}
	return s.Redis.start(ctx, 30*time.Second)
}

// AdminRedis is an unrestricted client of database db, straight to Redis
// (not through the proxy); the caller closes it.
func (s *Stack) AdminRedis(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.RedisPort), Username: adminUser,
		Password: s.adminPassword, DB: db, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second,
		WriteTimeout: 3 * time.Second, PoolSize: 4})
}

func pgBinDir() (string, error) {
	if p, err := exec.LookPath("postgres"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(r), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("soak: PostgreSQL binaries not found; install the postgresql package")
}

func (s *Stack) startPG(ctx context.Context) error {
	bin, err := pgBinDir()
	if err != nil {
		return err
	}
	dir := filepath.Join(s.cfg.Dir, "pg")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The "postgres" user below must traverse the working directory.
	if err := os.Chmod(s.cfg.Dir, 0o711); err != nil {
		return err
	}
	// PostgreSQL refuses to run as root: as root, it runs as "postgres".
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return errors.New("soak: running as root and no 'postgres' system user exists")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return err
		}
	}
	asPG := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HOME="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	data := filepath.Join(dir, "data")
	password, err := initPGData(ctx, bin, dir, data, cred, asPG)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	s.PGPort = port
	auth := url.UserPassword("postgres", password).String()
	server := fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", auth, port)
	s.DatabaseURL = fmt.Sprintf("postgres://%s@127.0.0.1:%d/han_soak?sslmode=disable", auth, port)
	s.PG = &proc{name: "postgres", args: func() *exec.Cmd {
		cmd := asPG(exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"))
		f, err := os.OpenFile(filepath.Join(s.cfg.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			cmd.Stdout, cmd.Stderr = f, f
		}
		return cmd
	}, ready: func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			return err
		}
		return c.Close(ctx)
	}}
	if err := s.PG.start(ctx, 60*time.Second); err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, server)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE DATABASE han_soak")
	return err
}

// initPGData runs initdb for the soak's PostgreSQL in data and returns the
// password it set. Every connection gives that password, made for this run
// (scram-sha-256): with trust, any account on the machine could log in as
// superuser while the soak runs. initdb reads it from a file only its owner
// can read, removed once it has run, never from its arguments.
func initPGData(ctx context.Context, bin, dir, data string, cred *syscall.Credential, asPG func(*exec.Cmd) *exec.Cmd) (string, error) {
	password := randomHex(24)
	pwfile := filepath.Join(dir, "initdb.pw")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return "", err
	}
	defer os.Remove(pwfile)
	if cred != nil {
		if err := os.Chown(pwfile, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	out, err := asPG(exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "--auth=scram-sha-256",
		"--pwfile="+pwfile, "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("initdb: %w: %s", err, lastLines(out))
	}
	return password, nil
}

func (s *Stack) startGateway(ctx context.Context, i int) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s.GWAddr[i] = addr
	redisURL := func(db int) string {
		return fmt.Sprintf("redis://%s:%s@%s/%d", rds.APIBackendUser, s.apiPassword, s.Proxy.Addr(), db)
	}
	env := append(os.Environ(),
		"HAN_HTTP_ADDR="+addr, "DATABASE_URL="+s.DatabaseURL, "REDIS_URL="+redisURL(0), "REDIS_REALTIME_URL="+redisURL(1),
		"HAN_JWT_DEV_HS256_SECRET="+s.DevSecret, "HAN_HMAC_SECRET=soak-hmac-"+randomHex(8),
		"HAN_INSTANCE_ID=soak-gw"+strconv.Itoa(i), "HAN_LOG_LEVEL=warn", "HAN_DEBUG_ENDPOINTS=1",
		"HAN_INSTANCE_LIVENESS_TTL="+s.cfg.LivenessTTL.String(), "HAN_PRESENCE_SWEEP_INTERVAL=1s",
		"HAN_OUTBOX_GRACE=1s", "HAN_SHUTDOWN_TIMEOUT=5s", "HAN_BLOB_DIR="+filepath.Join(s.cfg.Dir, "blobs"))
	logPath := filepath.Join(s.cfg.Dir, fmt.Sprintf("gateway%d.log", i))
	s.GW[i] = &proc{name: fmt.Sprintf("gateway%d", i), args: func() *exec.Cmd {
		cmd := exec.Command(filepath.Join(s.cfg.BinDir, "han-gateway"))
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			cmd.Stdout, cmd.Stderr = f, f
		}
		return cmd
	}, ready: func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %d", resp.StatusCode)
		}
		return nil
	}}
	return s.GW[i].start(ctx, 60*time.Second)
}

// Close stops every process and the proxy.
func (s *Stack) Close() {
	for _, g := range s.GW {
		if g != nil {
			g.kill()
		}
	}
	if s.Proxy != nil {
		s.Proxy.Close()
	}
	if s.PG != nil {
		s.PG.stop(syscall.SIGINT, 20*time.Second)
	}
	if s.Redis != nil {
		s.Redis.kill()
	}
}

// start launches the process (Redis and gateways get a parent-death signal
// here; PostgreSQL set its own with its credentials) and waits until ready
// answers or within passes.
func (p *proc) start(ctx context.Context, within time.Duration) error {
	cmd := p.args()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if c, ok := cmd.Stdout.(*os.File); ok {
			c.Close()
		}
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.Now().Add(within)
	for {
		select {
		case <-done:
			return fmt.Errorf("%s exited during start-up", p.name)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := p.ready(rctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s", p.name, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// Pid is the running process's id (0: none).
func (p *proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) kill() { p.stop(syscall.SIGKILL, 0) }

// stop sends sig and waits up to grace (then SIGKILL) for the exit.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

func lastLines(b []byte) string {
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(b)
}
