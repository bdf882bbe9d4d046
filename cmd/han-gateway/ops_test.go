package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
)

// The service refuses to start when the stub's task TTL does not cover
// poll interval × max polls + recovery budget, and says which variable.
func TestLegacyStubMisconfiguredRefusesToStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
	}{
		{"ttl below the budget", map[string]string{"HAN_LEGACY_STUB_TASK_TTL": "179s"}},
		{"more polls than the default ttl covers", map[string]string{"HAN_LEGACY_STUB_MAX_POLLS": "40", "HAN_LEGACY_STUB_TASK_TTL": "180s"}},
		{"recovery budget too short", map[string]string{"HAN_LEGACY_STUB_RECOVERY_BUDGET": "30s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := baseEnv()
			vars["HAN_LEGACY_STUB_ENABLED"] = "true"
			vars["HAN_LEGACY_STUB_URL"] = "redis://legacy_stub:s3cret-stub@127.0.0.1:1/2"
			for k, v := range tc.vars {
				vars[k] = v
			}
			m := NewMain()
			if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
				t.Fatal(err)
			}
			m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
			err := m.Run(context.Background())
			defer m.Close()
			if !errors.Is(err, legacystub.ErrConfig) || !strings.Contains(err.Error(), "HAN_LEGACY_STUB_") || strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("Run = %v, want a refusal naming the variable", err)
			}
			if m.Addr() != "" {
				t.Fatal("the refused instance is listening")
			}
		})
	}
	vars := baseEnv()
	vars["HAN_LEGACY_STUB_MAX_POLLS"] = "many"
	if err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] }); err == nil || !strings.Contains(err.Error(), "HAN_LEGACY_STUB_MAX_POLLS") {
		t.Fatalf("a non-numeric max polls: %v", err)
	}
	// Off, the same settings are not checked.
	vars = baseEnv()
	vars["HAN_LEGACY_STUB_TASK_TTL"] = "1s"
	m := start(t, vars)
	if code, _ := call(t, "GET", m.URL()+"/healthz", "", ""); code != 200 {
		t.Fatal("the stub settings must not matter while the stub is off")
	}
}

// The real program with the stub on (DB2 as legacy_stub) and a short
// settings refresh: a send is pending and polls reach a verdict; a policy
// changed in PostgreSQL is enforced without a restart.
func TestLegacyStubAndRuntimeSettingsEndToEnd(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-e2e-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = rs.URL(0), rs.URL(1)
	vars["HAN_LEGACY_STUB_ENABLED"], vars["HAN_LEGACY_STUB_URL"] = "true", rs.LegacyStubURL(2)
	vars["HAN_SETTINGS_REFRESH_INTERVAL"] = "50ms"
	m := start(t, vars)

	tok := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	alice, bob := ids.New(), ids.New()
	aTok := tok(alice)
	call(t, "GET", m.URL()+"/v1/me", tok(bob), "")
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	dialogID := body[strings.Index(body, `"id":"`)+6:][:36]
	code, body = callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, `{"body":"e2e"}`,
		map[string]string{"Idempotency-Key": "e2e-stub-1"})
	if code != 201 || !strings.Contains(body, `"safety":"pending"`) {
		t.Fatalf("send: %d %s", code, body)
	}
	msgID := body[strings.Index(body, `"id":"`)+6:][:36]
	admin := rs.AdminClient(2)
	defer admin.Close()
	if ttl := admin.PTTL(ctx, store.StubTaskKey(msgID)).Val(); ttl <= time.Minute {
		t.Fatalf("task PTTL %s must exceed the 60 s poll budget", ttl)
	}
	var last string
	for i := 0; i < 3; i++ {
		code, last = call(t, "GET", m.URL()+"/v1/messages/"+msgID+"/safety", aTok, "")
		if code != 200 {
			t.Fatalf("poll: %d %s", code, last)
		}
	}
	if !strings.Contains(last, `"safety":"approved"`) && !strings.Contains(last, `"safety":"rejected"`) {
		t.Fatalf("no verdict after 3 polls: %s", last)
	}

	// Runtime settings: GET /v1/me limited to 2 per minute, without a restart.
	pg, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(ctx)
	if _, err := pg.Exec(ctx, `INSERT INTO rate_limit_policies(route, algorithm, rules)
		VALUES ('GET /v1/me', 'fixed', '[{"family":"user","limit":2,"windowMs":60000}]')`); err != nil {
		t.Fatal(err)
	}
	defer pg.Exec(ctx, `DELETE FROM rate_limit_policies WHERE route = 'GET /v1/me'`) //nolint:errcheck
	var v int64
	if err := pg.QueryRow(ctx, "SELECT version FROM settings_head").Scan(&v); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return m.ops.settings.Version() == v }, "settings version %d not applied", v)
	// The API answers with the new policy's decisions: its RateLimit-Policy
	// field, then 429 rate_limited with Retry-After.
	carol := tok(ids.New())
	for i := 0; i < 2; i++ {
		resp, body := do(t, http.DefaultClient, "GET", m.URL()+"/v1/me", carol, "", nil)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != `"user";q=2;w=60` {
			t.Fatalf("request %d: %d %q %s", i+1, resp.StatusCode, resp.Header.Get("RateLimit-Policy"), body)
		}
	}
	resp, body := do(t, http.DefaultClient, "GET", m.URL()+"/v1/me", carol, "", nil)
	if resp.StatusCode != 429 || body != `{"error":"rate_limited"}` || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third request under the new policy: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}
