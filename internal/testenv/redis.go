package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// AdminUser is the unrestricted ACL user that only the test harness has; the
// code under test always connects as rds.APIBackendUser.
const AdminUser = "han_admin"

// RedisOptions configures a private redis-server.
type RedisOptions struct {
	MaxMemory      string // e.g. "2mb"; zero value means no limit
	EvictionPolicy string // zero value means noeviction
	AppendOnly     bool   // AOF on, in the server's directory
	// SeparateInstances renders the ACL with -select (DB0/DB1 split).
	SeparateInstances bool
	// ExtraACL lines are appended to the rendered ACL file.
	ExtraACL []string
	// LegacyStubPassword, when set, renders the legacy_stub user too
	// (han:stub:*, DB2 of the legacy safety stub); see LegacyStubURL.
	LegacyStubPassword string
	// Cluster starts the server as a Redis Cluster node (cluster-enabled,
	// its bus on ClusterBusPort) with the cluster ACL; StartCluster sets it.
	Cluster bool
	// ClusterNodeTimeout is cluster-node-timeout. Zero value means 1s.
	ClusterNodeTimeout time.Duration
	// Password and AdminPassword set api_backend's and the admin user's
	// passwords (every node of a cluster shares them). Zero value means a
	// random one.
	Password, AdminPassword string
	// Dir, when set, is reused (for restarts that keep the AOF); zero value
	// means a fresh temporary directory removed by Stop.
	Dir string
}

// RedisServer is a private redis-server process loaded with the rendered ACL.
type RedisServer struct {
	Opts     RedisOptions
	Port     int
	Password string // api_backend's password
	AdminPwd string
	Dir      string
	// BusPort is the cluster bus port of a cluster node, else 0.
	BusPort int

	mu   sync.Mutex // guards cmd
	cmd  *exec.Cmd
	done chan struct{}
	own  bool
}

// StartRedis starts a redis-server on a free loopback port.
func StartRedis(opts RedisOptions) (*RedisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("testenv: redis-server not found; install the redis-server package")
	}
	s := &RedisServer{Opts: opts, Password: opts.Password, AdminPwd: opts.AdminPassword, Dir: opts.Dir}
	if s.Password == "" {
		s.Password = "api-" + randHex(12)
	}
	if s.AdminPwd == "" {
		s.AdminPwd = "admin-" + randHex(12)
	}
	if s.Dir == "" {
		base := os.Getenv("HAN_TEST_TMPDIR")
		if base == "" {
			base = os.TempDir()
		}
		d, err := os.MkdirTemp(base, "han-redis-")
		if err != nil {
			return nil, err
		}
		s.Dir, s.own = d, true
	}
	acl := rds.RenderACL(rds.ACLOptions{
		APIBackendPassword: s.Password,
		SeparateInstances:  opts.SeparateInstances,
		Cluster:            opts.Cluster,
		LegacyStubPassword: opts.LegacyStubPassword,
		Extra:              append([]string{fmt.Sprintf("user %s on >%s ~* &* +@all", AdminUser, s.AdminPwd)}, opts.ExtraACL...),
	})
	if err := os.WriteFile(filepath.Join(s.Dir, "users.acl"), []byte(acl), 0o600); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s.Port = port
		if opts.Cluster {
			if s.BusPort, err = FreePort(); err != nil {
				return nil, err
			}
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	s.cleanup()
	return nil, lastErr
}

func (s *RedisServer) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--aclfile", filepath.Join(s.Dir, "users.acl"), "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(s.Dir, "redis.log"), "--protected-mode", "yes",
	}
	if s.Opts.AppendOnly {
		a = append(a, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.Opts.MaxMemory != "" {
		a = append(a, "--maxmemory", s.Opts.MaxMemory)
	}
	policy := s.Opts.EvictionPolicy
	if policy == "" {
		policy = "noeviction"
	}
	a = append(a, "--maxmemory-policy", policy)
	if s.Opts.Cluster {
		timeout := s.Opts.ClusterNodeTimeout
		if timeout <= 0 {
			timeout = time.Second
		}
		// A replica authenticates to its master as the admin user: the
		// default user is off.
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.BusPort), "--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--masteruser", AdminUser, "--masterauth", s.AdminPwd,
			// A replica's first sync starts at once, not after the
			// default 5 s wait for more replicas; a replica is listed in
			// CLUSTER SLOTS only once its replication offset moved, which
			// on an idle master takes one replica ping period (default 10 s).
			"--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1")
	}
	return a
}

func (s *RedisServer) start() error {
	cmd := exec.Command("redis-server", s.args()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done, err := startServer(cmd, "redis-server", filepath.Join(s.Dir, "redis.log"), func() bool {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return s.ping() == nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// startServer starts cmd and waits up to 10 s until ready reports true. It
// returns a channel closed when the process exits; a process that exits or
// never becomes ready is an error naming the last lines of its log.
func startServer(cmd *exec.Cmd, name, logPath string, ready func() bool) (chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("%s exited: %s", name, lastLines(log, 3))
		default:
		}
		if ready() {
			return done, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-done
	return nil, fmt.Errorf("%s did not become ready", name)
}

func (s *RedisServer) ping() error {
	c := s.AdminClient(0)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Addr is host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the api_backend URL of database db (the form REDIS_URL takes).
func (s *RedisServer) URL(db int) string {
	return fmt.Sprintf("redis://%s:%s@%s/%d", rds.APIBackendUser, s.Password, s.Addr(), db)
}

// LegacyStubURL is the legacy_stub URL of database db (the form
// HAN_LEGACY_STUB_URL takes); the server must have been started with
// RedisOptions.LegacyStubPassword.
func (s *RedisServer) LegacyStubURL(db int) string {
	return fmt.Sprintf("redis://%s:%s@%s/%d", rds.LegacyStubUser, s.Opts.LegacyStubPassword, s.Addr(), db)
}

// AdminURL is the unrestricted URL of database db (test setup and faults only).
func (s *RedisServer) AdminURL(db int) string {
	return fmt.Sprintf("redis://%s:%s@%s/%d", AdminUser, s.AdminPwd, s.Addr(), db)
}

// AdminClient returns an unrestricted client; the caller closes it.
func (s *RedisServer) AdminClient(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), Username: AdminUser, Password: s.AdminPwd, DB: db,
		MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
}

// Kill stops the server abruptly (SIGKILL), as a crash would.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Freeze stops the server's process (SIGSTOP) without closing anything: the
// kernel still accepts connections and buffers what clients send, and
// the server runs it all when thawed — a Redis that stalls instead of
// failing (a long fork, a swapping host, a paused VM). It returns thaw
// (SIGCONT, idempotent), which also runs when the test ends.
func (s *RedisServer) Freeze(t testing.TB) (thaw func()) {
	t.Helper()
	pid := s.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// StallableRedis starts a redis-server of the test's own (stopped when the
// test ends) and a client of its database db whose every call gives up
// after budget — dial, read and write, as the service's clients do — closed
// when the test ends: the set-up of the tests that stall it with Freeze.
func StallableRedis(t testing.TB, db int, budget time.Duration) (*RedisServer, redis.UniversalClient) {
	t.Helper()
	r, err := StartRedis(RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	c, err := rds.NewRedis(r.URL(db), rds.RedisConfig{DialTimeout: budget, ReadTimeout: budget, WriteTimeout: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	WarmPool(t, c)
	return r, c
}

// WarmPool leaves c's pool with handshaken connections, as on a running
// service: a connection the pool dials in the background and first uses
// while the server is stopped stalls in its handshake, and the command it
// was taken for never reaches the server. Four connections are taken,
// pinged and handed back. Taking them lets the pool fall below its minimum
// of idle connections, and it dials more in the background (it also does so
// when it is created); those join the idle list without a handshake, and the
// list is last in, first out: one that lands after the four are handed back
// is the next one used. So the four are held until the pool has no dial in
// flight, and handed back on top of what it dialed; they leave more idle
// than the minimum, so it dials none of its own afterwards. A test that
// stalls the server again after calls timed out (each took a connection
// out of the pool) warms it again first.
func WarmPool(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	sc, ok := c.(*redis.Client)
	if !ok {
		return
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	conns := make([]*redis.Conn, 4)
	for i := range conns {
		// The client's budget is the short one of a stall test, which a
		// busy machine can pass while the server is not stopped: a ping
		// that timed out is tried again on a connection of its own.
		for {
			conns[i] = sc.Conn()
			err := conns[i].Ping(ctx).Err()
			if err == nil {
				break
			}
			conns[i].Close()
			if !rds.Unanswered(err) || time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	// The pool counts a background dial as idle from its start, and as a
	// connection once it is connected: with the four held, the pool is
	// settled when its idle ones and the four are all its connections.
	settled := func() bool {
		st := sc.PoolStats()
		return int(st.IdleConns)+len(conns) == int(st.TotalConns)
	}
	for settleBy := time.Now().Add(10 * time.Second); !settled(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(settleBy) {
			t.Fatalf("the pool still dials after 10 s: %+v", *sc.PoolStats())
		}
	}
	for _, cn := range conns {
		cn.Close()
	}
}

// Restart starts the server again on the same port and directory (with AOF
// on, the data comes back; without it, the server is empty).
func (s *RedisServer) Restart() error {
	s.Kill()
	var err error
	for i := 0; i < 50; i++ {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Stop kills the server and removes its directory if the harness made it.
func (s *RedisServer) Stop() {
	if s == nil {
		return
	}
	s.Kill()
	s.cleanup()
}

func (s *RedisServer) cleanup() {
	if s.own && strings.Contains(s.Dir, "han-redis-") {
		os.RemoveAll(s.Dir)
	}
}

// Pid is the server's process id (0 while it is killed), for a benchmark
// that reads its CPU time.
func (s *RedisServer) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the server process is up (not killed).
func (s *RedisServer) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}
