package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// handshakeFrom opens a socket on m from the loopback address src with a
// bearer token or a ticket (then with an allowed Origin, as a browser
// does) and returns the close code and reason the server ended it with,
// or 0 and the first frame's type when the server said hello (the socket
// is closed then).
func handshakeFrom(t *testing.T, m *Main, src, bearer, ticket string) (websocket.StatusCode, string) {
	t.Helper()
	h := http.Header{}
	u := "ws://" + m.Addr() + "/v1/realtime"
	if bearer != "" {
		h.Set("Authorization", "Bearer "+bearer)
	}
	if ticket != "" {
		u += "?ticket=" + ticket
		h.Set("Origin", "http://localhost:8080")
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{gateway.Subprotocol},
		HTTPHeader: h, HTTPClient: hc})
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	defer ws.CloseNow()
	_, b, err := ws.Read(ctx)
	var ce websocket.CloseError
	switch {
	case errors.As(err, &ce):
		return ce.Code, ce.Reason
	case err != nil:
		t.Fatalf("read from %s: %v", src, err)
	}
	var f struct{ Type string }
	_ = json.Unmarshal(b, &f)
	return 0, f.Type
}

// guessTicket is a well-formed ticket nobody issued.
func guessTicket() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// issueTicket asks m for a ticket with tok.
func issueTicket(t *testing.T, m *Main, tok string) string {
	t.Helper()
	code, body := call(t, "POST", m.URL()+"/v1/realtime/tickets", tok, "")
	if code != 201 {
		t.Fatalf("ticket: %d %s", code, body)
	}
	var tk struct{ Ticket string }
	_ = json.Unmarshal([]byte(body), &tk)
	return tk.Ticket
}

// forgedUserToken is a well-formed user token signed with another secret.
func forgedUserToken(t *testing.T) string {
	t.Helper()
	s, err := auth.MintDevToken([]byte("not-the-dev-secret-0123456789abcdef"), auth.DevClaims{Subject: ids.New(), Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authFailEnv is the test environment with a budget of three refused
// credentials per address, refilled at one unit per 100 s: no unit comes
// back while a test runs.
func authFailEnv() map[string]string {
	vars := baseEnv()
	vars["HAN_AUTH_FAIL_BURST"], vars["HAN_AUTH_FAIL_RATE"] = "3", "0.01"
	return vars
}

// A client guessing tickets (or replaying forged tokens) over WebSocket
// handshakes spends its address's budget of refused credentials: past it,
// its handshakes are closed with 1013 and a reconnect delay before the
// ticket is redeemed (a valid ticket sent then stays usable) or the token
// verified (a valid token is refused the same way), while another address
// connects as before.
func TestForgedHandshakesPastTheBudgetAreNotVerified(t *testing.T) {
	m := start(t, authFailEnv())
	tok := userToken(t, ids.New())
	const attacker, other = "127.0.0.2", "127.0.0.3"
	for i := range 2 {
		if code, _ := handshakeFrom(t, m, attacker, "", guessTicket()); code != gateway.CloseUnauthorized {
			t.Fatalf("guessed ticket %d: close %d, want 4001", i, code)
		}
	}
	if code, _ := handshakeFrom(t, m, attacker, forgedUserToken(t), ""); code != gateway.CloseUnauthorized {
		t.Fatalf("forged token: close %d, want 4001", code)
	}
	// The budget is spent: a valid ticket is not redeemed.
	ticket := issueTicket(t, m, tok)
	code, reason := handshakeFrom(t, m, attacker, "", ticket)
	if code != gateway.CloseTryAgainLater || !strings.HasPrefix(reason, `{"retryMs":`) {
		t.Fatalf("valid ticket past the budget: close %d %q, want 1013 with retryMs", code, reason)
	}
	var advice struct{ RetryMs int64 }
	if err := json.Unmarshal([]byte(reason), &advice); err != nil || advice.RetryMs < 60_000 {
		t.Errorf("retry advice %q: want the wait for a unit (about 100 s), err %v", reason, err)
	}
	if code, _ := handshakeFrom(t, m, attacker, tok, ""); code != gateway.CloseTryAgainLater {
		t.Fatalf("valid token past the budget: close %d, want 1013", code)
	}
	opt, err := redis.ParseURL(baseEnv()["REDIS_REALTIME_URL"])
	if err != nil {
		t.Fatal(err)
	}
	rt := redis.NewClient(opt)
	defer rt.Close()
	if n, err := rt.Exists(context.Background(), gateway.TicketKey(ticket)).Result(); err != nil || n != 1 {
		t.Fatalf("the ticket sent past the budget was redeemed (exists %d, err %v)", n, err)
	}
	// Another address has a budget of its own, and the ticket still works.
	if code, typ := handshakeFrom(t, m, other, "", ticket); code != 0 || typ != "hello" {
		t.Fatalf("valid ticket from another address: close %d %q, want hello", code, typ)
	}
	fams := scrape(t, m)
	if n := counterValue(fams["han_ws_rejected_total"], map[string]string{"reason": "auth_limited"}); n != 2 {
		t.Errorf(`han_ws_rejected_total{reason="auth_limited"} = %v, want 2`, n)
	}
	if n := counterValue(fams["han_ws_rejected_total"], map[string]string{"reason": "unauthorized"}); n != 3 {
		t.Errorf(`han_ws_rejected_total{reason="unauthorized"} = %v, want 3`, n)
	}
}

// REST requests and handshakes spend one budget per address: forged
// tokens sent to the REST API leave the address's handshakes refused, and
// forged handshakes its REST requests.
func TestRESTAndHandshakeShareTheBudget(t *testing.T) {
	m := start(t, authFailEnv())
	tok := userToken(t, ids.New())
	forged := forgedUserToken(t)
	rest := func(src, tok string) int {
		resp, _ := do(t, clientFrom(src), "GET", m.URL()+"/v1/me", tok, "", nil)
		return resp.StatusCode
	}
	const a, b = "127.0.0.4", "127.0.0.5"
	// a: two REST refusals, one handshake refusal, then both refused.
	for range 2 {
		if code := rest(a, forged); code != 401 {
			t.Fatalf("forged REST token: %d, want 401", code)
		}
	}
	if code, _ := handshakeFrom(t, m, a, forged, ""); code != gateway.CloseUnauthorized {
		t.Fatalf("forged handshake: close %d, want 4001", code)
	}
	if code := rest(a, tok); code != 429 {
		t.Errorf("valid REST token after the shared budget is spent: %d, want 429", code)
	}
	if code, _ := handshakeFrom(t, m, a, tok, ""); code != gateway.CloseTryAgainLater {
		t.Errorf("valid handshake after the shared budget is spent: close %d, want 1013", code)
	}
	// b: the other way round.
	for range 3 {
		if code, _ := handshakeFrom(t, m, b, "", guessTicket()); code != gateway.CloseUnauthorized {
			t.Fatalf("guessed ticket: close %d, want 4001", code)
		}
	}
	if code := rest(b, tok); code != 429 {
		t.Errorf("valid REST token after forged handshakes spent the budget: %d, want 429", code)
	}
	// A good credential spends nothing: a fresh address connects as often
	// as it likes within its user's own handshake rate.
	for i := range 5 {
		if code, typ := handshakeFrom(t, m, "127.0.0.6", tok, ""); code != 0 || typ != "hello" {
			t.Fatalf("valid handshake %d from a fresh address: close %d %q", i, code, typ)
		}
	}
}
