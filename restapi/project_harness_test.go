package restapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// prjEnv is the HAN_ENV the project API tests run with, so the tests see it
// in every physical key.
const prjEnv = "test"

// prjHarness is one API server for the project Redis API on a given Redis
// (the package's server, or a private one for fault tests), with an admin
// client on the same server to look at the physical keys.
type prjHarness struct {
	*harness
	admin *redis.Client
	logs  *testenv.LogBuffer
}

// newPrjHarness serves the project API on the package's redis-server.
func newPrjHarness(t *testing.T) *prjHarness {
	t.Helper()
	base := newHarness(t)
	return base.projectServer(base.rdb, env.Redis)
}

// newPrjHarnessSlowRedis serves the project API on the package's
// redis-server through a client that waits up to a minute for a reply, for
// tests that write values of many MiB: on a loaded machine moving 16 MiB
// through Redis can take longer than the default one-second timeouts (up
// to 750 ms was measured under load), and those tests assert what the API
// makes of the body, not how fast Redis takes it.
func newPrjHarnessSlowRedis(t *testing.T) *prjHarness {
	t.Helper()
	base := newHarness(t)
	const wait = time.Minute
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{ReadTimeout: wait, WriteTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return base.projectServer(rdb, env.Redis)
}

// newPrjHarnessOn serves the project API on a private redis-server,
// connected with url (api_backend or a user with other ACL rules).
func newPrjHarnessOn(t *testing.T, rs *testenv.RedisServer, url string) *prjHarness {
	t.Helper()
	base := newHarness(t)
	rdb, err := rds.NewRedis(url, rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return base.projectServer(rdb, rs)
}

func (h *harness) projectServer(rdb redis.UniversalClient, rs *testenv.RedisServer) *prjHarness {
	t := h.t
	logs := &testenv.LogBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{
		Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789"), Env: prjEnv, EvictionPolicyTTL: time.Millisecond},
		Logger: logger, Store: h.store, Redis: rdb, Realtime: h.rt, Verifier: v})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	admin := rs.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	return &prjHarness{
		harness: &harness{t: t, srv: srv, api: api, pool: h.pool, rdb: rdb, rt: h.rt, store: h.store},
		admin:   admin, logs: logs,
	}
}

// testProject is a project with one member per role and an outsider.
type testProject struct {
	id                              string
	keys                            project.Keys
	read, write, admin, outsider    string // user tokens
	readID, writeID, adminID, outID string
	service                         string // a valid service token
}

func mint(t *testing.T, sub string, kind auth.Kind) string {
	t.Helper()
	c := auth.DevClaims{Subject: sub, Kind: kind, TTL: time.Hour}
	if kind == auth.KindService {
		c.Service = "billing"
	}
	tok, err := auth.MintDevToken(devSecret, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (h *prjHarness) project() testProject {
	t := h.t
	t.Helper()
	p := testProject{id: ids.New(), readID: ids.New(), writeID: ids.New(), adminID: ids.New(), outID: ids.New()}
	p.keys = project.NewKeys(prjEnv, p.id)
	if err := h.store.CreateProject(context.Background(), p.id, "test project", []store.ProjectMember{
		{UserID: p.readID, Role: store.RoleRead}, {UserID: p.writeID, Role: store.RoleWrite},
		{UserID: p.adminID, Role: store.RoleAdmin}}); err != nil {
		t.Fatal(err)
	}
	p.read, p.write, p.admin = mint(t, p.readID, auth.KindUser), mint(t, p.writeID, auth.KindUser), mint(t, p.adminID, auth.KindUser)
	p.outsider = mint(t, p.outID, auth.KindUser)
	p.service = mint(t, ids.New(), auth.KindService)
	return p
}

// as points the harness at a subtest until the returned func runs.
func (h *prjHarness) as(t *testing.T) func() {
	old := h.t
	h.t = t
	return func() { h.t = old }
}

func (p testProject) path(rest string) string { return "/projects/" + p.id + "/redis" + rest }

// put sends PUT /cache with a JSON body.
func (h *prjHarness) put(tok string, p testProject, body string) (int, []byte) {
	h.t.Helper()
	return h.do(tok, "PUT", p.path("/cache"), body)
}

// putKV stores a string entry and fails the test unless it is 201 or 200.
func (h *prjHarness) putKV(p testProject, key, value string, ttl int) cacheItem {
	h.t.Helper()
	code, b := h.put(p.write, p, fmt.Sprintf(`{"key":%q,"type":"string","value":%q,"ttlSeconds":%d}`, key, value, ttl))
	if code != 201 && code != 200 {
		h.t.Fatalf("PUT %q: %d %s", key, code, b)
	}
	return decode[cacheItem](h.t, b)
}

type cacheItem struct {
	Key                   string `json:"key"`
	Type                  string `json:"type"`
	Value                 string `json:"value"`
	SizeBytes             int64  `json:"sizeBytes"`
	ExpiresAt             int64  `json:"expiresAt"`
	UpdatedAt             *int64 `json:"updatedAt"`
	LegacyNoExpiry        bool   `json:"legacyNoExpiry"`
	LegacyDeadlinePending bool   `json:"legacyDeadlinePending"`
}

// list fetches one page of GET /cache.
func (h *prjHarness) list(tok string, p testProject, query string) listResp[cacheItem] {
	h.t.Helper()
	code, b := h.do(tok, "GET", p.path("/cache")+query, "")
	if code != 200 {
		h.t.Fatalf("GET /cache%s: %d %s", query, code, b)
	}
	return decode[listResp[cacheItem]](h.t, b)
}

// listAll pages through GET /cache and returns every page.
func (h *prjHarness) listAll(tok string, p testProject, query string) [][]cacheItem {
	h.t.Helper()
	var pages [][]cacheItem
	cursor := ""
	for i := 0; ; i++ {
		if i > 100 {
			h.t.Fatal("listing does not end")
		}
		q := query
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		page := h.list(tok, p, "?"+strings.TrimPrefix(q, "&"))
		pages = append(pages, page.Items)
		if page.NextCursor == nil {
			return pages
		}
		cursor = *page.NextCursor
	}
}

// projectKeys returns every physical key of the project, sorted.
func (h *prjHarness) projectKeys(p testProject) []string {
	h.t.Helper()
	keys, err := h.admin.Keys(context.Background(), p.keys.Prefix()+"*").Result()
	if err != nil {
		h.t.Fatal(err)
	}
	sort.Strings(keys)
	return keys
}

// entryKeysWithoutTTL returns the project's cache entry keys lacking a TTL.
func (h *prjHarness) entryKeysWithoutTTL(p testProject) []string {
	h.t.Helper()
	var bad []string
	for _, k := range h.projectKeys(p) {
		if strings.HasPrefix(k, p.keys.CacheEntryPrefix()) && h.admin.PTTL(context.Background(), k).Val() < 0 {
			bad = append(bad, k)
		}
	}
	return bad
}
