package restapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// stubServer is an API server with the legacy safety stub on, on a private
// redis-server whose ACL has the legacy_stub user: DB0/DB1 as api_backend,
// DB2 as legacy_stub, as on VM1 before cutover. db2 nil means the server's
// DB2 as legacy_stub; pass another client to break it.
func (h *harness) stubServer(rs *testenv.RedisServer, db2 redis.UniversalClient) (*harness, *legacystub.Stub) {
	h.t.Helper()
	return h.stubServerWith(rs, db2, legacystub.Config{RedisTimeout: 300 * time.Millisecond})
}

// stubServerWith is stubServer with the stub configured by cfg.
func (h *harness) stubServerWith(rs *testenv.RedisServer, db2 redis.UniversalClient, cfg legacystub.Config) (*harness, *legacystub.Stub) {
	t := h.t
	t.Helper()
	open := func(url string) redis.UniversalClient {
		c, err := rds.NewRedis(url, rds.RedisConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	rdb, rt := open(rs.URL(0)), open(rs.URL(1))
	if db2 == nil {
		db2 = open(rs.LegacyStubURL(2))
	}
	stub, err := legacystub.New(cfg, legacystub.Deps{DB2: db2, Store: h.store})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789")},
		Logger: logger, Store: h.store, Redis: rdb, Realtime: rt, Verifier: v, LegacyStub: stub})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, srv: srv, api: api, pool: h.pool, rdb: rdb, rt: rt, store: h.store}, stub
}

func startStubRedis(t *testing.T) *testenv.RedisServer {
	t.Helper()
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-" + ids.New()[:8]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if bad, err := rs.KeysWithoutTTL(context.Background()); err != nil || len(bad) > 0 {
			t.Errorf("keys without a TTL: %v %v", bad, err)
		}
		rs.Stop()
	})
	return rs
}

type safetyResp struct {
	MessageID string `json:"messageId"`
	Safety    string `json:"safety"`
}

func TestLegacyStubSendIsPendingAndPollsReachAVerdict(t *testing.T) {
	ctx := context.Background()
	base := newHarness(t)
	rs := startStubRedis(t)
	h, stub := base.stubServer(rs, nil)
	_, aTok := h.user()
	bob, bTok := h.user()
	_, eveTok := h.user()
	d := h.dialog(aTok, bob)

	key := idemKey()
	code, body, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"check me"}`, key)
	if code != 201 || !strings.Contains(string(body), `"safety":"pending"`) {
		t.Fatalf("send with the stub on: %d %s", code, body)
	}
	m := decode[messageResp](t, body)

	// The task lives in DB2 with a TTL beyond the poll budget.
	admin := rs.AdminClient(2)
	defer admin.Close()
	cfg := stub.Config()
	ttl := admin.PTTL(ctx, store.StubTaskKey(m.ID)).Val()
	if ttl <= cfg.PollBudget() || ttl > cfg.TaskTTL {
		t.Fatalf("task PTTL %s, want (%s, %s]", ttl, cfg.PollBudget(), cfg.TaskTTL)
	}
	if h := admin.HGetAll(ctx, store.StubTaskKey(m.ID)).Val(); h["state"] != "pending" || h["polls"] != "0" || h["created_ms"] == "" {
		t.Fatalf("task HASH: %v", h)
	}
	// api_backend (REDIS_URL) cannot touch it.
	if err := h.rdb.Do(ctx, "hgetall", store.StubTaskKey(m.ID)).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("api_backend read han:stub:*: %v", err)
	}

	// A replay answers the same bytes, pending included.
	code2, body2, hdr := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"check me"}`, key)
	if code2 != 201 || !bytes.Equal(body, body2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s", code2, body2)
	}

	path := "/v1/messages/" + m.ID + "/safety"
	for i := 1; i < cfg.VerdictAfterPolls; i++ {
		code, b := h.do(bTok, "GET", path, "")
		if code != 200 || string(b) != fmt.Sprintf(`{"messageId":%q,"safety":"pending"}`, m.ID) {
			t.Fatalf("poll %d: %d %s", i, code, b)
		}
	}
	code, b := h.do(aTok, "GET", path, "")
	s := decode[safetyResp](t, b)
	if code != 200 || s.MessageID != m.ID || (s.Safety != "approved" && s.Safety != "rejected") {
		t.Fatalf("poll %d must give a verdict: %d %s", cfg.VerdictAfterPolls, code, b)
	}
	for i := 0; i < 2; i++ {
		if _, b2 := h.do(bTok, "GET", path, ""); !bytes.Equal(b, b2) {
			t.Fatalf("the verdict changed: %s then %s", b, b2)
		}
	}
	if n := admin.HGet(ctx, store.StubTaskKey(m.ID), "polls").Val(); n != fmt.Sprint(cfg.VerdictAfterPolls) {
		t.Fatalf("DB2 counted %s polls (decided tasks answer from PostgreSQL)", n)
	}

	// Only members see it; the message DTO of history stays as it was.
	code, b = h.do(eveTok, "GET", path, "")
	wantError(t, code, b, 404, "message_not_found")
	code, b = h.do(aTok, "GET", "/v1/messages/"+ids.New()+"/safety", "")
	wantError(t, code, b, 404, "message_not_found")
	code, b = h.do(aTok, "GET", "/v1/messages/not-a-uuid/safety", "")
	wantError(t, code, b, 400, "invalid_uuid")
	code, b = h.do(aTok, "GET", "/v1/dialogs/"+d.ID+"/messages?afterSeq=0", "")
	if code != 200 || strings.Contains(string(b), "safety") {
		t.Fatalf("history must not carry safety: %d %s", code, b)
	}

	// A message sent while the stub was off has no task.
	code, body, _ = base.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"before the stub"}`, idemKey())
	if code != 201 {
		t.Fatalf("send without the stub: %d %s", code, body)
	}
	old := decode[messageResp](t, body)
	code, b = h.do(aTok, "GET", "/v1/messages/"+old.ID+"/safety", "")
	wantError(t, code, b, 404, "safety_task_not_found")
}

// With the stub off the message DTO is exactly that of docs/api.md and the safety
// route does not exist.
func TestLegacyStubOffKeepsTheMessageDTO(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	code, body, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"plain"}`, idemKey())
	if code != 201 {
		t.Fatalf("send: %d %s", code, body)
	}
	fields := decode[map[string]any](t, body)
	want := []string{"attachments", "body", "createdAt", "dialogId", "id", "senderId", "seq"}
	if len(fields) != len(want) {
		t.Fatalf("DTO fields %v, want exactly %v", fields, want)
	}
	for _, k := range want {
		if _, ok := fields[k]; !ok {
			t.Fatalf("DTO lacks %s: %s", k, body)
		}
	}
	m := decode[messageResp](t, body)
	code, b := h.do(aTok, "GET", "/v1/messages/"+m.ID+"/safety", "")
	wantError(t, code, b, 404, "not_found")
}

// DB2 down: a send still succeeds (the task row is in PostgreSQL and
// recovery decides it later); a poll of a pending task fails closed with
// 503 redis_unavailable and no Redis text.
func TestLegacyStubWithDB2Down(t *testing.T) {
	base := newHarness(t)
	rs := startStubRedis(t)
	dead, err := rds.NewRedis("redis://legacy_stub:x@127.0.0.1:1/2", rds.RedisConfig{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	h, _ := base.stubServer(rs, dead)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	code, body, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"no db2"}`, idemKey())
	if code != 201 || !strings.Contains(string(body), `"safety":"pending"`) {
		t.Fatalf("send with DB2 down: %d %s", code, body)
	}
	m := decode[messageResp](t, body)
	if tk, err := h.store.StubTask(context.Background(), m.ID); err != nil || tk.State != store.StubPending {
		t.Fatalf("task row: %+v %v", tk, err)
	}
	code, b := h.do(aTok, "GET", "/v1/messages/"+m.ID+"/safety", "")
	wantError(t, code, b, 503, "redis_unavailable")
}

// A stalled DB2 (the legacy Redis paused, not refusing) does not hold every
// message send until the stub's Redis timeout: the send that finds DB2
// unreachable waits it out, and the sends after it skip DB2 for the cooldown
// and answer at once, 201 with safety:"pending". Their tasks are not lost:
// the rows are pending in PostgreSQL, where recovery finds them, and once DB2
// answers again a poll of one answers pending (DB2 never got it) until
// recovery decides it.
func TestLegacyStubSendDoesNotWaitForAStalledDB2(t *testing.T) {
	base := newHarness(t)
	rs := startStubRedis(t)
	cfg := legacystub.Config{RedisTimeout: time.Second, CreateCooldown: 10 * time.Second}
	stalled := startStubRedis(t)
	db2, err := rds.NewRedis(stalled.LegacyStubURL(2), rds.RedisConfig{DialTimeout: cfg.RedisTimeout,
		ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db2.Close() })
	testenv.WarmPool(t, db2)
	h, _ := base.stubServerWith(rs, db2, cfg)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)

	thaw := stalled.Freeze(t)
	var sent []messageResp
	for i := range 3 {
		start := time.Now()
		code, body, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"x"}`, idemKey())
		took := time.Since(start)
		if code != 201 || !strings.Contains(string(body), `"safety":"pending"`) {
			t.Fatalf("send %d with DB2 stalled: %d %s", i, code, body)
		}
		// The first send is the one that finds DB2 stalled.
		if i > 0 && took >= cfg.RedisTimeout/2 {
			t.Fatalf("send %d took %s: the committed message's answer waited for the stalled DB2", i, took.Round(time.Millisecond))
		}
		sent = append(sent, decode[messageResp](t, body))
	}
	for _, m := range sent {
		if tk, err := h.store.StubTask(context.Background(), m.ID); err != nil || tk.State != store.StubPending {
			t.Fatalf("task row of %s: %+v %v", m.ID, tk, err)
		}
	}
	thaw()
	code, body := h.do(aTok, "GET", "/v1/messages/"+sent[2].ID+"/safety", "")
	if code != 200 || decode[safetyResp](t, body).Safety != legacystub.SafetyPending {
		t.Fatalf("poll of a task DB2 never got: %d %s", code, body)
	}
}
