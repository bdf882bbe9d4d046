package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// Main.Close with Redis (both roles) stalled instead of failing: every
// step is bounded, so Close ends within HAN_DRAIN_DELAY +
// HAN_SHUTDOWN_TIMEOUT and a few seconds, inside a supervisor's stop budget.
func TestCloseIsBoundedWhenRedisStalls(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	vars["HAN_SHUTDOWN_TIMEOUT"] = "1s"
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	lg := &closeLog{start: time.Now()}
	m.Logger = slog.New(slog.NewJSONHandler(lg, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	tok := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	alice, bob := ids.New(), ids.New()
	aTok, bTok := tok(alice), tok(bob)
	for _, tk := range []string{aTok, bTok} {
		call(t, "GET", m.URL()+"/v1/me", tk, "")
	}
	_, body := call(t, "POST", m.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	dialogID := body[strings.Index(body, `"id":"`)+6:][:36]
	for i := 0; i < 5; i++ {
		if code, b := callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, fmt.Sprintf(`{"body":"m%d"}`, i),
			map[string]string{"Idempotency-Key": fmt.Sprintf("stall-%d", i)}); code != 201 {
			t.Fatalf("send: %d %s", code, b)
		}
	}
	time.Sleep(1500 * time.Millisecond) // settle: relay, presence, purger have run
	thaw := r.Freeze(t)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		t.Logf("Close returned after %v: %v\n%s", time.Since(start).Round(100*time.Millisecond), err, lg.String())
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("Close took %v", d)
		}
	case <-time.After(30 * time.Second):
		thaw()
		<-done
		t.Fatalf("Main.Close with Redis stalled had not returned after 30 s\nlog:\n%s", lg.String())
	}
}
