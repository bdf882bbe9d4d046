package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Env is what a test package gets from Run: its own redis-server and its own
// PostgreSQL database.
type Env struct {
	Redis *RedisServer
	// DatabaseURL points at a database created for this package alone;
	// through a private PgBouncer in transaction pooling mode when
	// HAN_TEST_PGBOUNCER=1 (PgBouncerEnv).
	DatabaseURL string
	// DirectURL points at the same database straight on PostgreSQL (the
	// form HAN_DATABASE_DIRECT_URL takes); DatabaseURL without a bouncer.
	DirectURL string
	// Bouncer is the private PgBouncer, nil without HAN_TEST_PGBOUNCER=1.
	Bouncer *PgBouncer
	// Cluster is the private Redis Cluster, nil unless Options.Cluster.
	Cluster *RedisCluster

	cluster *PGCluster
	dropDB  func()
}

// BouncerOn reports whether HAN_TEST_PGBOUNCER=1 asks for the database
// to be reached through a private PgBouncer.
func BouncerOn() bool { return os.Getenv(PgBouncerEnv) == "1" }

// Options selects what Run starts.
type Options struct {
	Postgres bool
	Redis    bool
	RedisOpt RedisOptions
	// Cluster starts a private Redis Cluster (ClusterOpt) for the package.
	// The end-of-run TTL audit covers only Redis, not the cluster.
	Cluster    bool
	ClusterOpt ClusterOptions
	// IgnoreLeaks lists goroutine top functions goleak may ignore
	// (third-party background goroutines only).
	IgnoreLeaks []string
	// SkipTTLAudit turns off the end-of-run audit that fails the package
	// when any han:api:*, han:rt:*, han:coord:* or han:settings:* key in its
	// redis-server (DB0 and DB1) has no TTL (every key of those families must
	// carry one, docs/redis-keys.md).
	SkipTTLAudit bool
	// Check, when set, runs after the tests; an error fails the run (the
	// OpenAPI answer check, package apicheck).
	Check func() error
}

// TTLPatterns are the key families that must always carry a TTL.
var TTLPatterns = []string{"han:api:*", "han:rt:*", "han:coord:*", "han:settings:*"}

// KeysWithoutTTL scans the server's DB0 and DB1 and returns every key of
// TTLPatterns that has no expiry.
func (s *RedisServer) KeysWithoutTTL(ctx context.Context) ([]string, error) {
	var bad []string
	for _, db := range []int{0, 1} {
		c := s.AdminClient(db)
		for _, p := range TTLPatterns {
			it := c.Scan(ctx, 0, p, 500).Iterator()
			for it.Next(ctx) {
				ttl, err := c.PTTL(ctx, it.Val()).Result()
				if err != nil {
					c.Close()
					return nil, err
				}
				if ttl == -1 {
					bad = append(bad, fmt.Sprintf("db%d:%s", db, it.Val()))
				}
			}
			if err := it.Err(); err != nil {
				c.Close()
				return nil, err
			}
		}
		c.Close()
	}
	return bad, nil
}

// Start starts what opts asks for. PostgreSQL: the server named by
// HAN_TEST_DATABASE_URL (set by the test command, which starts one private
// cluster for the run) or, when that is unset, DATABASE_URL set on purpose,
// else a private cluster of this package's own. With HAN_TEST_PGBOUNCER=1 a
// private PgBouncer stands in front of it (a missing pgbouncer fails the
// start, never skips it).
func Start(opts Options) (*Env, error) {
	e := &Env{}
	if opts.Redis {
		r, err := StartRedis(opts.RedisOpt)
		if err != nil {
			return nil, err
		}
		e.Redis = r
	}
	if opts.Cluster {
		c, err := StartCluster(opts.ClusterOpt)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.Cluster = c
	}
	if opts.Postgres {
		server := os.Getenv(ServerURLEnv)
		if server == "" {
			server = os.Getenv("DATABASE_URL")
		}
		if server == "" {
			c, err := StartPGCluster()
			if err != nil {
				e.Close()
				return nil, err
			}
			e.cluster = c
			server = c.URL
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		prefix := "han_" + filepath.Base(os.Args[0])
		url, drop, err := CreateDatabase(ctx, server, prefix)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.DatabaseURL, e.DirectURL, e.dropDB = url, url, drop
		if BouncerOn() {
			b, err := StartPgBouncer(server)
			if err != nil {
				e.Close()
				return nil, err
			}
			e.Bouncer = b
			mode := os.Getenv(PgBouncerExecModeEnv)
			if mode == "" {
				mode = "exec"
			}
			e.DatabaseURL = b.URL(url, mode)
		}
	}
	return e, nil
}

// Close stops everything Start started.
func (e *Env) Close() {
	if e == nil {
		return
	}
	e.Bouncer.Stop()
	if e.dropDB != nil {
		e.dropDB()
	}
	e.cluster.Stop()
	e.Redis.Stop()
	e.Cluster.Stop()
}

// Main is the body of a package's TestMain: it starts the environment, runs
// the tests, stops the environment and then fails the run if goroutines leaked.
func Main(m *testing.M, opts Options, env **Env) {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(2)
	}
	*env = e
	code := m.Run()
	if opts.Check != nil {
		if err := opts.Check(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	if code == 0 && e.Redis != nil && !opts.SkipTTLAudit {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		bad, err := e.Redis.KeysWithoutTTL(ctx)
		cancel()
		switch {
		case err != nil:
			fmt.Fprintln(os.Stderr, "ttl audit:", err)
			code = 1
		case len(bad) > 0:
			fmt.Fprintln(os.Stderr, "ttl audit: keys without a TTL:", bad)
			code = 1
		}
	}
	e.Close()
	if code == 0 {
		var gl []goleak.Option
		for _, f := range opts.IgnoreLeaks {
			gl = append(gl, goleak.IgnoreTopFunction(f))
		}
		// goleak retries for about a second; go-redis's pool re-dials a dead
		// server in a goroutine that sleeps 1 s between attempts and only
		// notices its pool was closed when it wakes. Give such goroutines a
		// few more seconds to end; anything still running then is a leak.
		err := goleak.Find(gl...)
		for i := 0; err != nil && i < 4; i++ {
			time.Sleep(time.Second)
			err = goleak.Find(gl...)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// PeerCloses reports whether the peer closes c (EOF or a reset) within d:
// it reads and discards from r (c itself, or a reader buffering it) until
// the read ends, and only a read deadline that passed counts as open.
func PeerCloses(c net.Conn, r io.Reader, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// Eventually polls cond until it returns true or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("eventually: "+msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
