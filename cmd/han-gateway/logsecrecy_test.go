package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/testenv"
)

// Logs contain no secret, cached value or PII: the real program logs at
// debug level into a buffer across a full scenario — authentication (and a
// forged token), an idempotent send, a cache put with a secret-looking key
// and value, a topic publish, a realtime connection, bad requests, and a
// Redis outage with its recovery. No token, password, secret, cache value,
// message body, publish payload or raw client IP appears in any line.
func TestLogsCarryNoSecrets(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	var logs testenv.LogBuffer
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	vars["HAN_LOG_LEVEL"] = "debug"
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })

	// Every request leaves from 127.0.0.2 (still loopback) and claims a
	// forwarded address, so both raw IPs can be looked for.
	const clientIP, forwardedIP = "127.0.0.2", "203.0.113.77"
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}).DialContext}
	defer tr.CloseIdleConnections()
	old := http.DefaultClient
	http.DefaultClient = &http.Client{Transport: apiCheck.Transport(forwarded{tr, forwardedIP})}
	defer func() { http.DefaultClient = old }()

	s := newScenario(t, m)
	const (
		body      = "msg-body-7f3c1e-private-words"
		cacheKey  = "apikey-9d1b7"
		cacheVal  = "sk_live_51HxSECRETvalue0123456789"
		payload   = "payload-secret-4a2b"
		forgedTok = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJldmlsIn0.forged-signature-x1y2"
	)
	if code, b := s.send("secret-1", body); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	if code, b := s.prj("PUT", "/cache", fmt.Sprintf(`{"key":%q,"type":"string","value":%q}`, cacheKey, cacheVal)); code/100 != 2 {
		t.Fatalf("cache put: %d %s", code, b)
	}
	if code, b := s.prj("GET", "/cache?prefix=apikey", ""); code != 200 || !strings.Contains(b, cacheVal) {
		t.Fatalf("cache list: %d %s", code, b)
	}
	if code, b := s.publish("evt-secret", fmt.Sprintf(`{"card":%q}`, payload)); code/100 != 2 {
		t.Fatalf("publish: %d %s", code, b)
	}
	// Refusals: a forged token, a malformed body, an unknown cache key.
	call(t, "GET", m.URL()+"/v1/me", forgedTok, "")
	s.send("secret-2", `"broken`)
	s.prj("DELETE", "/cache?key="+cacheKey+"-missing", "")
	s.prj("PUT", "/cache", fmt.Sprintf(`{"key":%q,"type":"json","value":"{not json %s"}`, cacheKey, cacheVal))

	// Realtime with the bearer token.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+m.Addr()+"/v1/realtime", &websocket.DialOptions{
		Subprotocols: []string{"han.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + s.aTok}},
		HTTPClient: http.DefaultClient})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+s.dialog+`"}`))
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"nonsense","secret":"`+payload+`"}`))

	// A Redis outage: internal failures are logged, without their secrets.
	r.Kill()
	s.send("secret-3", body+"-during-outage")
	s.prj("PUT", "/cache", fmt.Sprintf(`{"key":%q,"type":"string","value":%q}`, cacheKey, cacheVal))
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := s.send("secret-4", body+"-after")
		return code == 201
	}, "no recovery after the outage")
	c.Close(websocket.StatusNormalClosure, "")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	out := logs.String()
	if strings.Count(out, "\n") < 10 {
		t.Fatalf("the scenario logged almost nothing; the capture is broken:\n%s", out)
	}
	forbidden := map[string]string{
		"user token":          s.aTok,
		"user token (part)":   s.aTok[len(s.aTok)-20:],
		"forged token":        forgedTok,
		"dev JWT secret":      devSecret,
		"HMAC secret":         vars["HAN_HMAC_SECRET"],
		"Redis password":      r.Password,
		"Redis URL":           r.URL(0),
		"PostgreSQL URL":      vars["DATABASE_URL"],
		"message body":        body,
		"cache key":           cacheKey,
		"cache value":         cacheVal,
		"publish payload":     payload,
		"client IP":           clientIP,
		"forwarded client IP": forwardedIP,
	}
	if pw := pgPassword(vars["DATABASE_URL"]); pw != "" {
		forbidden["PostgreSQL password"] = pw
	}
	for what, v := range forbidden {
		if v != "" && strings.Contains(out, v) {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, v) {
					t.Errorf("%s in the logs: %s", what, l)
					break
				}
			}
		}
	}
}

// forwarded adds X-Forwarded-For / X-Real-IP to every request.
type forwarded struct {
	rt http.RoundTripper
	ip string
}

func (f forwarded) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", f.ip)
	r.Header.Set("X-Real-IP", f.ip)
	return f.rt.RoundTrip(r)
}

func pgPassword(u string) string {
	at := strings.Index(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 {
		return ""
	}
	_, pw, ok := strings.Cut(u[scheme+3:at], ":")
	if !ok || len(pw) < 4 {
		return ""
	}
	return pw
}

// The service writes no key under a Safety prefix, checked as admin: after a full
// scenario of the service (legacy stub off), no database of its Redis holds
// a Safety or stub key.
func TestServiceRedisHoldsNoSafetyKeys(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	if code, b := s.send("ns-1", "hello"); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	if code, b := s.publish("ns-1", `{"a":1}`); code/100 != 2 {
		t.Fatalf("publish: %d %s", code, b)
	}
	var total int
	for db := 0; db <= 2; db++ {
		total += countKeys(t, r, db, "*")
		for _, p := range []string{"han:stub:*", "*safety*", "*Safety*", "message_safety*"} {
			if n := countKeys(t, r, db, p); n != 0 {
				t.Errorf("db%d holds %d key(s) matching %s", db, n, p)
			}
		}
	}
	if total == 0 {
		t.Fatal("the scenario wrote nothing to Redis: the scan proves nothing")
	}
}
