package settings_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

// testSecret is the deployment secret the instances of the tests share
// (HAN_HMAC_SECRET): it signs the snapshots they share.
var testSecret = []byte("settings-test-secret-0123456789")

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Redis: true, Postgres: true}, &env) }

var (
	migrateOnce sync.Once
	migrateErr  error
)

type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *store.Store
	db0   redis.UniversalClient
	db1   redis.UniversalClient

	mu        sync.Mutex
	published map[int64]int // version → publishes by any provider of this fixture
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	migrateOnce.Do(func() { _, migrateErr = store.Migrate(ctx, pool) })
	if migrateErr != nil {
		t.Fatal(migrateErr)
	}
	// Start every test from the built-in table.
	if _, err := pool.Exec(ctx, "DELETE FROM rate_limit_policies; DELETE FROM runtime_settings"); err != nil {
		t.Fatal(err)
	}
	db0, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db1, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db0.Close(); db1.Close() })
	return &fixture{t: t, pool: pool, store: store.New(pool), db0: db0, db1: db1, published: map[int64]int{}}
}

// provider is one instance's settings provider (scope "test").
func (f *fixture) provider(cfg settings.Config) *settings.Provider {
	f.t.Helper()
	if cfg.Scope == "" {
		cfg.Scope = "test"
	}
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	cfg.OnPublish = func(v int64) {
		f.mu.Lock()
		f.published[v]++
		f.mu.Unlock()
	}
	p, err := settings.New(cfg, f.store, f.db1)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(p.Close)
	if err := p.Refresh(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) publishes(v int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.published[v]
}

func (f *fixture) exec(q string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), q, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) version() int64 {
	f.t.Helper()
	h, err := f.store.SettingsHead(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return h.Version
}

// snapshotKey is the shared snapshot key of the state PostgreSQL is at.
func (f *fixture) snapshotKey() string {
	f.t.Helper()
	var (
		v     int64
		stamp string
	)
	if err := f.pool.QueryRow(context.Background(), "SELECT version, stamp::text FROM settings_head").Scan(&v, &stamp); err != nil {
		f.t.Fatal(err)
	}
	return settings.SnapshotKey(v, stamp)
}

// instance is one instance's rate limiter taking its policies from p, on
// the shared DB0: the limiter the REST API asks before every request.
func (f *fixture) instance(p *settings.Provider) *ratelimit.Limiter {
	f.t.Helper()
	lim, err := ratelimit.New(ratelimit.Config{Redis: f.db0, Policies: p})
	if err != nil {
		f.t.Fatal(err)
	}
	return lim
}

// decision is what the limiter answered one request: whether it is
// admitted, the RateLimit-Policy field the API sends with it and, for a
// denial, the Retry-After seconds.
type decision struct {
	allowed    bool
	policy     string
	retryAfter int
}

// get asks lim about one request of user to method template, as the REST
// API's rate-limit step does (the route's policy, the user as subject).
func get(t *testing.T, lim *ratelimit.Limiter, user, method, template string) decision {
	t.Helper()
	label, pol := lim.Policies().Lookup(method, template)
	d, err := lim.Decide(context.Background(), label, pol, ratelimit.Subject{UserID: user})
	if err != nil {
		t.Fatal(err)
	}
	return decision{allowed: d.Allowed, policy: ratelimit.PolicyField(d), retryAfter: d.RetryAfterSeconds()}
}

// head is the state PostgreSQL is at.
func (f *fixture) head() (int64, string) {
	f.t.Helper()
	h, err := f.store.SettingsHead(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return h.Version, h.Stamp
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
