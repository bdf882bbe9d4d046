package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// After Main.Close no goroutine of the service's own packages is
// left running (the relay, the purger, the janitor, the marker, the
// publisher's batcher, presence, the subscriber).
func TestCloseLeavesNoServiceGoroutines(t *testing.T) {
	m := NewMain()
	vars := baseEnv()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	if err := m.Run(t.Context()); err != nil {
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
	for i := 0; i < 20; i++ {
		callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, fmt.Sprintf(`{"body":"m%d"}`, i),
			map[string]string{"Idempotency-Key": fmt.Sprintf("leak-%d", i)})
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	var left []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		left = left[:0]
		var dump bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
		for _, g := range strings.Split(dump.String(), "\n\n") {
			if strings.Contains(g, "github.com/han-app/gateway/") && !strings.Contains(g, "TestCloseLeaves") &&
				!strings.Contains(g, "testing.(*T)") && !strings.Contains(g, "testenv") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("%d service goroutines still running 5 s after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}
