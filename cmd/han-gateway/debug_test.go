package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// The load test reads the gateway's memory after a forced GC from
// /debug/memstats (docs/loadtest.md): it is served only with the debug
// switch on and only to loopback peers, and it counts open connections.
func TestDebugMemstats(t *testing.T) {
	t.Run("off by default", func(t *testing.T) {
		m := start(t, baseEnv())
		if m.Debug {
			t.Fatal("debug endpoints on without HAN_DEBUG_ENDPOINTS")
		}
		for _, p := range []string{"/debug/memstats", "/debug/pprof/"} {
			if code, body := call(t, "GET", m.URL()+p, "", ""); code == http.StatusOK {
				t.Fatalf("GET %s with debug off: %d %s", p, code, body)
			}
		}
	})

	vars := baseEnv()
	vars[debugEnv] = "1"
	m := start(t, vars)
	if code, _ := call(t, "GET", m.URL()+"/debug/pprof/", "", ""); code != http.StatusOK {
		t.Fatalf("GET /debug/pprof/ with debug on: %d", code)
	}
	read := func() memStats {
		t.Helper()
		code, body := call(t, "GET", m.URL()+"/debug/memstats", "", "")
		if code != http.StatusOK {
			t.Fatalf("GET /debug/memstats: %d %s", code, body)
		}
		var st memStats
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("memstats %q: %v", body, err)
		}
		if !st.GCForced || st.HeapInuse == 0 || st.StackInuse == 0 || st.Goroutines == 0 {
			t.Fatalf("memstats: %+v", st)
		}
		return st
	}
	if st := read(); st.Connections != 0 {
		t.Fatalf("connections before any socket: %d", st.Connections)
	}
	tok, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: ids.New(), Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+m.Addr()+"/v1/realtime", &websocket.DialOptions{
		Subprotocols: []string{"han.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, _, err := c.Read(ctx); err != nil { // hello
		t.Fatal(err)
	}
	if st := read(); st.Connections != 1 {
		t.Fatalf("connections with one socket open: %d", st.Connections)
	}
	_ = c.Close(websocket.StatusNormalClosure, "")

	// A peer that is not on loopback gets the ordinary handler (here: 404).
	h := m.withDebug(http.NotFoundHandler())
	for _, remote := range []string{"192.0.2.7:5555", "[2001:db8::1]:5555", "garbage"} {
		req := httptest.NewRequest("GET", "/debug/memstats", nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound {
			t.Fatalf("from %s: %d, want the ordinary 404", remote, rec.Code)
		}
	}
	for _, remote := range []string{"127.0.0.1:5555", "[::1]:5555"} {
		req := httptest.NewRequest("GET", "/debug/memstats", nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("from %s: %d, want 200", remote, rec.Code)
		}
	}
}
