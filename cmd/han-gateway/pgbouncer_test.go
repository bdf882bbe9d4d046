package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// The service runs behind PgBouncer in transaction pooling mode:
// DATABASE_URL through the bouncer with HAN_DB_EXEC_MODE=exec serves the
// chat round trip and readiness, and the migrations go over
// HAN_DATABASE_DIRECT_URL (a database that only the direct URL names gets
// the schema).
func TestRunsBehindPgBouncer(t *testing.T) {
	b := testenv.BouncerFor(t, env)
	ctx := context.Background()
	fresh := func() string {
		u, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "han_gw_bouncer")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(drop)
		return u
	}
	served, migratedOnly := fresh(), fresh()

	vars := baseEnv()
	vars["DATABASE_URL"] = b.URL(served, "")
	vars["HAN_DATABASE_DIRECT_URL"] = served
	vars["HAN_DB_EXEC_MODE"] = "exec"
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	mint := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tok := mint(alice)
	if code, _ := call(t, "GET", m.URL()+"/v1/me", mint(bob), ""); code != 200 {
		t.Fatalf("bob's first request: %d", code)
	}
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", tok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	dialogID := body[strings.Index(body, `"id":"`)+6:][:36]
	for i := 1; i <= 3; i++ {
		code, body = callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", tok, `{"body":"hi"}`,
			map[string]string{"Idempotency-Key": fmt.Sprintf("bouncer-%d", i)})
		if code != 201 || !strings.Contains(body, fmt.Sprintf(`"seq":%d`, i)) {
			t.Fatalf("send %d: %d %s", i, code, body)
		}
	}
	code, body = callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", tok, `{"body":"hi"}`,
		map[string]string{"Idempotency-Key": "bouncer-1"})
	if code != 201 || !strings.Contains(body, `"seq":1`) {
		t.Fatalf("replayed send: %d %s", code, body)
	}
	code, body = call(t, "GET", m.URL()+"/v1/dialogs/"+dialogID+"/messages?afterSeq=1", tok, "")
	if code != 200 || strings.Count(body, `"body":"hi"`) != 2 {
		t.Fatalf("history: %d %s", code, body)
	}
	if code, _ := call(t, "GET", m.URL()+"/readyz", "", ""); code != 200 {
		t.Fatalf("/readyz: %d", code)
	}

	vars["HAN_DATABASE_DIRECT_URL"] = migratedOnly
	start(t, vars)
	conn, err := pgx.Connect(ctx, migratedOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n == 0 {
		t.Fatalf("the direct URL's database was not migrated: %d rows: %v", n, err)
	}
}
