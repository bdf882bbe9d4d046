package restapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

func TestAuthRejections(t *testing.T) {
	h := newHarness(t)
	uid := ids.New()
	mint := func(secret []byte, c auth.DevClaims) string {
		tok, err := auth.MintDevToken(secret, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := mint(devSecret, auth.DevClaims{Subject: uid, Kind: auth.KindUser, TTL: time.Hour})
	cases := []struct {
		name   string
		header string
		status int
		code   string
	}{
		{"no token", "", 401, "unauthorized"},
		{"not bearer", "Basic " + good, 401, "unauthorized"},
		{"garbage", "Bearer not.a.jwt", 401, "unauthorized"},
		{"bad signature", "Bearer " + mint([]byte("another-secret-0123456789abcdef-xyz"), auth.DevClaims{Subject: uid, Kind: auth.KindUser, TTL: time.Hour}), 401, "unauthorized"},
		{"expired", "Bearer " + mint(devSecret, auth.DevClaims{Subject: uid, Kind: auth.KindUser, TTL: -time.Hour}), 401, "unauthorized"},
		{"service token", "Bearer " + mint(devSecret, auth.DevClaims{Subject: uid, Kind: auth.KindService, Service: "billing", TTL: time.Hour}), 403, "user_session_required"},
		{"alg none", "Bearer " + noneToken(uid), 401, "unauthorized"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.header != "" {
				hdr["Authorization"] = c.header
			}
			code, b, _ := h.doH("", "GET", "/v1/dialogs", "", hdr)
			wantError(t, code, b, c.status, c.code)
		})
	}
	if code, _ := h.do(good, "GET", "/v1/me", ""); code != 200 {
		t.Fatalf("valid token: %d", code)
	}
}

func noneToken(sub string) string {
	enc := func(s string) string {
		return strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(b64(s)), "=")
	}
	return enc(`{"alg":"none","typ":"JWT"}`) + "." + enc(fmt.Sprintf(`{"sub":%q,"exp":%d}`, sub, time.Now().Add(time.Hour).Unix())) + "."
}

// countingReader yields n bytes of 'a' and counts what was consumed.
type countingReader struct {
	left int64
	read atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > c.left {
		n = c.left
	}
	for i := range p[:n] {
		p[i] = 'a'
	}
	c.left -= n
	c.read.Add(n)
	return int(n), nil
}

func TestOversizedBodyIsRefusedWithoutReadingIt(t *testing.T) {
	h := newHarness(t)
	_, tok := h.user()

	t.Run("declared length", func(t *testing.T) {
		body := &countingReader{left: 512 << 20}
		req, _ := http.NewRequest("POST", h.srv.URL+"/v1/dialogs", body)
		req.ContentLength = 512 << 20
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantError(t, resp.StatusCode, b, 413, "payload_too_large")
		if got := body.read.Load(); got > 32<<20 {
			t.Fatalf("client sent %d bytes before the refusal; the server must not read the body", got)
		}
	})
	t.Run("chunked", func(t *testing.T) {
		body := &countingReader{left: 512 << 20}
		req, _ := http.NewRequest("POST", h.srv.URL+"/v1/dialogs", io.NopCloser(body))
		req.ContentLength = -1
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantError(t, resp.StatusCode, b, 413, "payload_too_large")
		// The server stops at the 64 KiB limit; what else left the client
		// sits in loopback socket buffers, far below the 512 MiB offered.
		if got := body.read.Load(); got > 32<<20 {
			t.Fatalf("client sent %d bytes: the server kept reading past the limit", got)
		}
	})
}

func TestMetricsServeRuntimeAndProcessCollectors(t *testing.T) {
	h := newHarness(t)
	h.do("", "GET", "/healthz", "")
	code, b := h.do("", "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, fam := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_open_fds", `han_http_requests_total{code="200",method="GET",route="/healthz"}`} {
		if !strings.Contains(string(b), fam) {
			t.Errorf("/metrics lacks %s", fam)
		}
	}
}

func TestHealthAndReadiness(t *testing.T) {
	h := newHarness(t)
	code, b := h.do("", "GET", "/healthz", "")
	if code != 200 || string(b) != `{"status":"ok"}` {
		t.Fatalf("/healthz: %d %s", code, b)
	}
	code, b = h.do("", "GET", "/readyz", "")
	if code != 200 || !strings.Contains(string(b), `"status":"ok"`) {
		t.Fatalf("/readyz: %d %s", code, b)
	}
	h.api.SetDraining()
	code, b = h.do("", "GET", "/readyz", "")
	if code != 503 || !strings.Contains(string(b), `"status":"draining"`) {
		t.Fatalf("draining /readyz: %d %s", code, b)
	}
}

func TestReadinessDegradedWhenRedisIsDown(t *testing.T) {
	// A server of its own: this test kills it.
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	h := newHarness(t)
	rdb, _ := rds.NewRedis(r.URL(0), rds.RedisConfig{})
	defer rdb.Close()
	h2 := h.withClients(rdb, rdb)
	r.Kill()
	code, b := h2.do("", "GET", "/readyz", "")
	if code != 200 || !strings.Contains(string(b), `"status":"degraded"`) || !strings.Contains(string(b), `"redis":"down"`) {
		t.Fatalf("/readyz with Redis down: %d %s", code, b)
	}
	// The truth is in PostgreSQL: history keeps working.
	_, tok := h2.user()
	if code, _ := h2.do(tok, "GET", "/v1/dialogs", ""); code != 200 {
		t.Fatalf("GET /v1/dialogs with Redis down: %d", code)
	}
}

func TestMessageEventIsPublishedAfterCommit(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	sub := h.rt.Subscribe(context.Background(), "han:rt:dialog:"+d.ID)
	defer sub.Close()
	if _, err := sub.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"hi"}`, idemKey())
	if code != 201 {
		t.Fatalf("%d %s", code, b)
	}
	m := decode[messageResp](t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"type":"event","channel":"dialog:%s","id":"`, d.ID)
	if !strings.HasPrefix(msg.Payload, want) {
		t.Fatalf("event frame: %s", msg.Payload)
	}
	tail := fmt.Sprintf(`"event":"message.created","entityId":"%s","dialogId":"%s","seq":1,"data":%s}`, m.ID, d.ID, b)
	if !strings.HasSuffix(msg.Payload, tail) {
		t.Fatalf("event frame %s\nwant suffix %s", msg.Payload, tail)
	}
	_ = alice
	// The delivered mark is batched: it lands within the flush interval.
	testenv.Eventually(t, 5*time.Second, func() bool {
		var delivered bool
		err := h.pool.QueryRow(context.Background(), "SELECT delivered_at IS NOT NULL FROM outbox WHERE entity_id=$1", m.ID).Scan(&delivered)
		return err == nil && delivered
	}, "outbox row not marked delivered")
}

func TestPublicConfig(t *testing.T) {
	h := newHarness(t)
	code, b := h.do("", "GET", "/v1/public/config", "")
	if code != 200 || !strings.Contains(string(b), `"realtimeUrl":"ws://`+strings.TrimPrefix(h.srv.URL, "http://")+`/v1/realtime"`) ||
		!strings.Contains(string(b), `"messageBodyMaxChars":4000`) {
		t.Fatalf("public config: %d %s", code, b)
	}
}

var _ = errors.New
var _ redis.UniversalClient
