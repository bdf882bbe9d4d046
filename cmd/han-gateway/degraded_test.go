package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// The whole program (rate limiter, idempotency, degraded DB0 handling wired
// together) with its own redis-server killed mid-test: a completed send
// replays from PostgreSQL, a new send fails closed, history keeps working,
// and sends succeed again once Redis is back, without a restart.
func TestWholeServiceDB0Outage(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	m := start(t, vars)

	alice, bob := ids.New(), ids.New()
	tok := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	aTok, bTok := tok(alice), tok(bob)
	call(t, "GET", m.URL()+"/v1/me", bTok, "")
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	dialog := body[strings.Index(body, `"id":"`)+6:][:36]
	send := func(key, text string) (int, string) {
		return callH(t, "POST", m.URL()+"/v1/dialogs/"+dialog+"/messages", aTok, `{"body":"`+text+`"}`,
			map[string]string{"Idempotency-Key": key, "Content-Type": "application/json"})
	}
	code, first := send("k-1", "before the outage")
	if code != 201 {
		t.Fatalf("send: %d %s", code, first)
	}

	r.Kill()
	code, replay := send("k-1", "before the outage")
	if code != 201 || replay != first {
		t.Fatalf("a completed send must replay from PostgreSQL while Redis is down: %d %s", code, replay)
	}
	start := time.Now()
	code, body = send("k-2", "during the outage")
	if code != 503 || body != `{"error":"redis_unavailable"}` {
		t.Fatalf("a new send must fail closed: %d %s", code, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("fail-closed took %v, over 3× the 1 s Redis budget", d)
	}
	code, body = call(t, "GET", m.URL()+"/v1/dialogs/"+dialog+"/messages?afterSeq=0", bTok, "")
	if code != 200 || !strings.Contains(body, "before the outage") || strings.Contains(body, "during the outage") {
		t.Fatalf("history during the outage: %d %s", code, body)
	}
	if code, body := call(t, "GET", m.URL()+"/readyz", "", ""); code != 200 || !strings.Contains(body, "degraded") {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if _, metrics := call(t, "GET", m.URL()+"/metrics", "", ""); !strings.Contains(metrics, "han_redis_db0_degraded 1") {
		t.Fatal("han_redis_db0_degraded must be 1 while DB0 is down")
	}

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := send("k-2", "during the outage")
		return code == 201
	}, "sends did not recover after Redis came back")
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, metrics := call(t, "GET", m.URL()+"/metrics", "", "")
		return strings.Contains(metrics, "han_redis_db0_degraded 0")
	}, "han_redis_db0_degraded did not return to 0")
	code, body = call(t, "GET", m.URL()+"/v1/dialogs/"+dialog+"/messages?afterSeq=0", bTok, "")
	if code != 200 || strings.Count(body, `"seq":`) != 2 {
		t.Fatalf("want exactly two messages after recovery: %s", body)
	}
}
