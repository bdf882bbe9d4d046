package settings_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

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
	v, err := f.store.SettingsVersion(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

var devSecret = []byte("settings-test-secret-0123456789ab")

// instance is one API server whose rate limiter takes its policies from p.
func (f *fixture) instance(p *settings.Provider) *httptest.Server {
	f.t.Helper()
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: f.db0}, logger)
	if err != nil {
		f.t.Fatal(err)
	}
	lim, err := ratelimit.New(ratelimit.Config{Redis: f.db0, Policies: p})
	if err != nil {
		f.t.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789")},
		Logger: logger, Store: f.store, Redis: f.db0, Realtime: f.db1, Verifier: v, RateLimits: lim})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(api.Close)
	srv := httptest.NewServer(api.Handler())
	f.t.Cleanup(srv.Close)
	return srv
}

func token(t *testing.T) string {
	t.Helper()
	tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: ids.New(), Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func get(t *testing.T, srv *httptest.Server, tok, path string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}
