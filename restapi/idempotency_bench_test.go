package restapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// benchServer is the API on the package's real Redis and PostgreSQL, with
// sends allowed without a key (the baseline).
func benchServer(b *testing.B) *httptest.Server {
	b.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	rdb, _ := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	rt, _ := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	b.Cleanup(func() { rdb.Close(); rt.Close() })
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	v, err := auth.NewVerifier(ctx, auth.Config{DevHS256Secret: devSecret, Redis: rdb}, logger)
	if err != nil {
		b.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789"),
		Attachments: restapi.AttachmentConfig{BlobDir: b.TempDir()}},
		Logger: logger, Store: store.New(pool), Redis: rdb, Realtime: rt, Verifier: v})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(api.Close)
	restapi.SetIdempotencyKeyOptional(api, true)
	srv := httptest.NewServer(api.Handler())
	b.Cleanup(srv.Close)
	return srv
}

func benchCall(b *testing.B, srv *httptest.Server, tok, method, path, body, key string) (int, string) {
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// benchDialog makes two users, the first creating a dialog with the
// second, and returns the first's token and the dialog's messages path.
func benchDialog(b *testing.B, srv *httptest.Server) (tok, path string) {
	b.Helper()
	mint := func(sub string) string {
		s, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	alice, bob := ids.New(), ids.New()
	tok = mint(alice)
	benchCall(b, srv, mint(bob), "GET", "/v1/me", "", "")
	code, body := benchCall(b, srv, tok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q]}`, bob), "")
	if code != 201 {
		b.Fatalf("dialog: %d %s", code, body)
	}
	return tok, "/v1/dialogs/" + body[strings.Index(body, `"id":"`)+6:][:36] + "/messages"
}

// BenchmarkIdempotentSendOverhead measures POST /v1/dialogs/{id}/messages
// through the whole HTTP stack on real Redis and PostgreSQL: a send with a
// fresh Idempotency-Key (reserve script, idempotency_records row in the send
// transaction, complete script, lock heartbeat goroutine), the same send
// without a key, and a replay (the same key again, which re-reads the
// message instead of inserting one). The three are interleaved in one loop
// so they share the machine's state; the ratios are the result.
func BenchmarkIdempotentSendOverhead(b *testing.B) {
	srv := benchServer(b)
	aTok, path := benchDialog(b, srv)
	send := func(key string) time.Duration {
		start := time.Now()
		code, out := benchCall(b, srv, aTok, "POST", path, `{"body":"benchmark message"}`, key)
		if code != 201 {
			b.Fatalf("send: %d %s", code, out)
		}
		return time.Since(start)
	}
	for i := 0; i < 50; i++ { // warm pools and script caches
		send("")
		send(ids.New())
	}
	replayKey := ids.New()
	send(replayKey)
	var plain, keyed, replay time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plain += send("")
		keyed += send(ids.New())
		replay += send(replayKey)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(plain.Microseconds())/n, "µs/send-nokey")
	b.ReportMetric(float64(keyed.Microseconds())/n, "µs/send-key")
	b.ReportMetric(float64(replay.Microseconds())/n, "µs/replay")
	b.ReportMetric(float64(keyed)/float64(plain), "key/nokey")
	b.ReportMetric(float64(replay)/float64(plain), "replay/nokey")
}

// BenchmarkSendHandlerAllocs is one keyed send through the whole handler
// chain (every middleware, the limiter and idempotency scripts, the send
// transaction, the publish) served straight from api.Handler() with a
// recorder, so the allocations per op are the server's (the process's
// Redis and PostgreSQL clients included, no HTTP client; the requests are
// built before the timer, only the small recorder is the benchmark's). The
// send route's rate-limit rules are the built-in ones.
func BenchmarkSendHandlerAllocs(b *testing.B) {
	srv := benchServer(b)
	h := srv.Config.Handler
	aTok, path := benchDialog(b, srv)
	request := func() *http.Request {
		req := httptest.NewRequest("POST", path, strings.NewReader(`{"body":"benchmark message"}`))
		req.RemoteAddr = "192.0.2.7:40000"
		req.Header.Set("Authorization", "Bearer "+aTok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", ids.New())
		return req
	}
	send := func(req *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 201 {
			b.Fatalf("send: %d %s", rec.Code, rec.Body.String())
		}
	}
	for i := 0; i < 50; i++ { // warm pools and script caches
		send(request())
	}
	reqs := make([]*http.Request, b.N)
	for i := range reqs {
		reqs[i] = request()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, req := range reqs {
		send(req)
	}
}
