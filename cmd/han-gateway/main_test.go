package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/internal/testenv/apicheck"
)

var env *testenv.Env

// apiCheck validates every answer against docs/openapi.yaml: it wraps
// http.DefaultTransport, and a test with a transport of its own wraps that.
var apiCheck *apicheck.Checker

// runMainEnv makes this test binary run the program's main() instead of
// the tests: drain_test.go and help_test.go start it as a child process to
// signal it and read its exit status.
const runMainEnv = "HAN_GATEWAY_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	// Every answer the tests receive is checked against docs/openapi.yaml.
	var err error
	if apiCheck, err = apicheck.Install(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true, Check: apiCheck.Err}, &env)
}

const devSecret = "gateway-e2e-secret-0123456789abcdef"

// ownRedisEnv starts a private redis-server for the test (stopped at its
// end, after the instance) and returns it with baseEnv pointed at it.
func ownRedisEnv(t *testing.T) (*testenv.RedisServer, map[string]string) {
	t.Helper()
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	return r, vars
}

func baseEnv() map[string]string {
	return map[string]string{
		"HAN_HTTP_ADDR":            "127.0.0.1:0",
		"REDIS_URL":                env.Redis.URL(0),
		"REDIS_REALTIME_URL":       env.Redis.URL(1),
		"DATABASE_URL":             env.DatabaseURL,
		"HAN_JWT_DEV_HS256_SECRET": devSecret,
		"HAN_HMAC_SECRET":          "hmac-secret-0123456789",
		"HAN_ALLOWED_ORIGINS":      "http://localhost:8080",
		// No load balancer watches the tests' instances: Close drains at
		// once (drain_test.go sets a delay).
		"HAN_DRAIN_DELAY": "0",
	}
}

func start(t *testing.T, vars map[string]string) *Main {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func call(t *testing.T, method, url, tok, body string) (int, string) {
	t.Helper()
	return callH(t, method, url, tok, body, nil)
}

func callH(t *testing.T, method, url, tok, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The README's curl walk-through, against the real program.
func TestEndToEndDialogRoundTrip(t *testing.T) {
	m := start(t, baseEnv())
	alice, bob := ids.New(), ids.New()
	tok := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	aTok, bTok := tok(alice), tok(bob)
	if code, _ := call(t, "GET", m.URL()+"/v1/me", bTok, ""); code != 200 {
		t.Fatalf("bob's first request: %d", code)
	}
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	dialogID := body[strings.Index(body, `"id":"`)+6:][:36]
	code, body = callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, `{"body":"hello bob"}`,
		map[string]string{"Idempotency-Key": "e2e-send-1"})
	if code != 201 || !strings.Contains(body, `"seq":1`) {
		t.Fatalf("send: %d %s", code, body)
	}
	code, body = call(t, "GET", m.URL()+"/v1/dialogs/"+dialogID+"/messages?afterSeq=0", bTok, "")
	if code != 200 || !strings.Contains(body, `"body":"hello bob"`) || !strings.Contains(body, `"nextCursor":null`) {
		t.Fatalf("history: %d %s", code, body)
	}
	code, body = call(t, "GET", m.URL()+"/", "", "")
	if code != 200 || !strings.Contains(body, "<html") {
		t.Fatalf("web client: %d", code)
	}
	if code, _ := call(t, "GET", m.URL()+"/readyz", "", ""); code != 200 {
		t.Fatalf("/readyz: %d", code)
	}
	// Close drains: the port stops answering.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(m.URL() + "/healthz"); err == nil {
		t.Fatal("server still answering after Close")
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close must be idempotent: %v", err)
	}
}

func TestConfigErrorsNeverEchoSecrets(t *testing.T) {
	vars := baseEnv()
	vars["HAN_ENV"] = "prod"
	vars["REDIS_URL"] = "mysql://api_backend:TOPSECRET@host/0"
	m := NewMain()
	err := m.ParseFlags(nil, func(k string) string { return vars[k] })
	if err == nil {
		t.Fatal("invalid configuration accepted")
	}
	msg := err.Error()
	for _, leak := range []string{"TOPSECRET", devSecret, "hmac-secret"} {
		if strings.Contains(msg, leak) {
			t.Fatalf("error echoes a secret: %s", msg)
		}
	}
	for _, want := range []string{"REDIS_URL", "HAN_JWT_DEV_HS256_SECRET: refused when HAN_ENV=prod"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error should mention %q: %s", want, msg)
		}
	}
	delete(vars, "DATABASE_URL")
	vars["HAN_ENV"] = "dev"
	vars["REDIS_URL"] = env.Redis.URL(0)
	if err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] }); err == nil || !strings.Contains(err.Error(), "DATABASE_URL: required") {
		t.Fatalf("missing DATABASE_URL: %v", err)
	}
}

func TestStartsDegradedWhileRedisIsDown(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.Stop()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	vars["HAN_REDIS_TIMEOUT"] = "200ms"
	m := start(t, vars)
	code, body := call(t, "GET", m.URL()+"/readyz", "", "")
	if code != 200 || !strings.Contains(body, `"status":"degraded"`) {
		t.Fatalf("/readyz with Redis down at start-up: %d %s", code, body)
	}
}

func TestUnknownAPIPathIs404AndWrongMethod405(t *testing.T) {
	m := start(t, baseEnv())
	if code, body := call(t, "POST", m.URL()+"/v1/nowhere", "", ""); code != 404 || body != `{"error":"not_found"}` {
		t.Fatalf("POST /v1/nowhere: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", m.URL()+"/healthz", "", ""); code != 405 || body != `{"error":"method_not_allowed"}` {
		t.Fatalf("DELETE /healthz: %d %s", code, body)
	}
}
