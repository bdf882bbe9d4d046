package restapi_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/internal/testenv/apicheck"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// Every answer the tests receive is checked against docs/openapi.yaml.
	check, err := apicheck.Install()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true, Check: check.Err}, &env)
}

var devSecret = []byte("test-dev-secret-0123456789abcdef")

// harness is one API server on real Redis and PostgreSQL.
type harness struct {
	t     *testing.T
	srv   *httptest.Server
	api   *restapi.Server
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	rt    redis.UniversalClient
	store *store.Store
}

var migrated bool

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 60})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if !migrated {
		if _, err := store.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		migrated = true
	}
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close(); rt.Close() })
	h := &harness{t: t, pool: pool, store: store.New(pool)}
	return h.withClients(rdb, rt)
}

// withClients builds another server on the same database with other Redis
// clients (tests that kill a Redis of their own).
func (h *harness) withClients(rdb, rt redis.UniversalClient) *harness {
	return h.server(io.Discard, func(d *restapi.Deps) { d.Redis, d.Realtime = rdb, rt })
}

// withLog builds another server on h's database and Redis clients that
// keeps its log; edit, if not nil, changes its Deps first.
func (h *harness) withLog(edit func(*restapi.Deps)) (*harness, *testenv.LogBuffer) {
	logs := &testenv.LogBuffer{}
	return h.server(logs, func(d *restapi.Deps) {
		d.Redis, d.Realtime = h.rdb, h.rt
		if edit != nil {
			edit(d)
		}
	}), logs
}

// server builds another server on h's database, logging to log; edit sets
// its Redis clients and may change the rest of its Deps. Unless edit sets
// one, the verifier takes the dev tokens of devSecret (devVerifier).
func (h *harness) server(log io.Writer, edit func(*restapi.Deps)) *harness {
	t := h.t
	logger := slog.New(slog.NewJSONHandler(log, nil))
	d := restapi.Deps{Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789")}, Logger: logger, Store: h.store}
	edit(&d)
	if d.Verifier == nil {
		d.Verifier = devVerifier(t, d.Redis, logger)
	}
	api, err := restapi.NewServer(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close) // stops the DB0 health prober if a test left Redis down
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, srv: srv, api: api, pool: h.pool, rdb: d.Redis, rt: d.Realtime, store: h.store}
}

// devVerifier verifies the dev tokens of devSecret.
func devVerifier(t *testing.T, rdb redis.UniversalClient, logger *slog.Logger) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// user returns a fresh user id and a token for it (the user is recorded on
// first sight by any authenticated request).
func (h *harness) user() (string, string) {
	h.t.Helper()
	id := ids.New()
	tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: id, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	if code, _ := h.do(tok, "GET", "/v1/me", ""); code != 200 {
		h.t.Fatalf("GET /v1/me = %d", code)
	}
	return id, tok
}

func (h *harness) do(tok, method, path, body string) (int, []byte) {
	h.t.Helper()
	code, b, _ := h.doH(tok, method, path, body, nil)
	return code, b
}

func (h *harness) doH(tok, method, path, body string, hdr map[string]string) (int, []byte, http.Header) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func wantError(t *testing.T, code int, body []byte, wantCode int, wantErr string) {
	t.Helper()
	if code != wantCode || string(body) != `{"error":"`+wantErr+`"}` {
		t.Fatalf("got %d %s, want %d {\"error\":%q}", code, body, wantCode, wantErr)
	}
}
