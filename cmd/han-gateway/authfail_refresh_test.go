package main

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
)

// connectFrom opens a socket on m from the loopback address src with a
// bearer token and waits for hello.
func connectFrom(t *testing.T, m *Main, src, bearer string) *rtClient {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	c := openRT(t, "ws://"+m.Addr()+"/v1/realtime", &websocket.DialOptions{Subprotocols: []string{gateway.Subprotocol},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + bearer}}, HTTPClient: hc})
	c.hello = c.expect("hello")
	return c
}

// refreshAnswer sends a refresh frame with tok and returns its answer:
// "refreshed", or the error frame's code and its retryMs (0 when absent).
func (c *rtClient) refreshAnswer(tok string) (string, int64) {
	c.t.Helper()
	c.send(`{"type":"refresh","token":"` + tok + `"}`)
	f := c.next(10 * time.Second)
	for f.Type == "event" {
		f = c.next(10 * time.Second)
	}
	switch f.Type {
	case "refreshed":
		return "refreshed", 0
	case "error":
		var e struct {
			Error   string
			RetryMs int64
		}
		if err := json.Unmarshal(f.raw, &e); err != nil {
			c.t.Fatalf("error frame %s: %v", f.raw, err)
		}
		return e.Error, e.RetryMs
	}
	c.t.Fatalf("want refreshed or error, got %s", f.raw)
	return "", 0
}

// stillOpen fails the test unless the connection answers a ping.
func (c *rtClient) stillOpen() {
	c.t.Helper()
	c.send(`{"type":"ping"}`)
	c.expect("pong")
}

// A connected client that sends refresh frames with forged tokens spends
// its address's budget of refused credentials: past it, every refresh is
// answered rate_limited with the wait, without its token being verified
// (a valid token sent then is refused the same way, and only the budget's
// three refusals were verifications), and the connection stays open with
// its credential. Another address refreshes as before.
func TestForgedRefreshesPastTheBudgetAreNotVerified(t *testing.T) {
	m := start(t, authFailEnv())
	user := ids.New()
	tok := userToken(t, user)
	c := connectFrom(t, m, "127.0.1.2", tok)
	for i := range 3 {
		if code, _ := c.refreshAnswer(forgedUserToken(t)); code != "unauthorized" {
			t.Fatalf("forged refresh %d: %s, want unauthorized", i, code)
		}
	}
	const past = 5
	for i := range past {
		code, retryMs := c.refreshAnswer(forgedUserToken(t))
		if code != "rate_limited" {
			t.Fatalf("forged refresh %d past the budget: %s, want rate_limited", i, code)
		}
		if retryMs < 60_000 || retryMs > 300_000 {
			t.Errorf("forged refresh %d past the budget: retryMs %d, want the wait for a unit (about 100 s)", i, retryMs)
		}
	}
	if code, _ := c.refreshAnswer(tok); code != "rate_limited" {
		t.Fatalf("valid refresh past the budget: %s, want rate_limited (not verified)", code)
	}
	c.stillOpen()
	// Another address has a budget of its own.
	if code, _ := connectFrom(t, m, "127.0.1.3", tok).refreshAnswer(tok); code != "refreshed" {
		t.Fatalf("valid refresh from another address: %s, want refreshed", code)
	}
	fams := scrape(t, m)
	for reason, want := range map[string]float64{"unauthorized": 3, "auth_limited": past + 1} {
		if n := counterValue(fams["han_ws_refresh_rejected_total"], map[string]string{"reason": reason}); n != want {
			t.Errorf(`han_ws_refresh_rejected_total{reason=%q} = %v, want %v`, reason, n, want)
		}
	}
	c.stillOpen()
}

// Refresh frames, REST requests and handshakes of one address spend one
// budget: a refresh with a good token works while the budget holds a
// unit and spends nothing; forged credentials sent by any of the three
// leave the others refused; a valid token of another user closes the
// connection with 4003 and spends nothing.
func TestRefreshSharesTheBudgetWithRESTAndHandshakes(t *testing.T) {
	m := start(t, authFailEnv())
	user := ids.New()
	tok := userToken(t, user)
	forged := forgedUserToken(t)
	rest := func(src, tok string) int {
		resp, _ := do(t, clientFrom(src), "GET", m.URL()+"/v1/me", tok, "", nil)
		return resp.StatusCode
	}
	const a, b, c = "127.0.1.4", "127.0.1.5", "127.0.1.6"

	// a: good refreshes spend nothing; then one refusal each by REST,
	// handshake and refresh spends the budget for all three.
	ca := connectFrom(t, m, a, tok)
	for i := range 5 {
		if code, _ := ca.refreshAnswer(tok); code != "refreshed" {
			t.Fatalf("valid refresh %d: %s, want refreshed", i, code)
		}
	}
	if code := rest(a, forged); code != 401 {
		t.Fatalf("forged REST token: %d, want 401", code)
	}
	if code, _ := handshakeFrom(t, m, a, forged, ""); code != gateway.CloseUnauthorized {
		t.Fatalf("forged handshake: close %d, want 4001", code)
	}
	if code, _ := ca.refreshAnswer(forged); code != "unauthorized" {
		t.Fatalf("forged refresh: %s, want unauthorized", code)
	}
	if code, _ := ca.refreshAnswer(tok); code != "rate_limited" {
		t.Errorf("valid refresh after the shared budget is spent: %s, want rate_limited", code)
	}
	if code := rest(a, tok); code != 429 {
		t.Errorf("valid REST token after the shared budget is spent: %d, want 429", code)
	}
	if code, _ := handshakeFrom(t, m, a, tok, ""); code != gateway.CloseTryAgainLater {
		t.Errorf("valid handshake after the shared budget is spent: close %d, want 1013", code)
	}
	ca.stillOpen()

	// b: forged refreshes alone spend the budget REST and handshakes use.
	cb := connectFrom(t, m, b, tok)
	for range 3 {
		if code, _ := cb.refreshAnswer(forged); code != "unauthorized" {
			t.Fatalf("forged refresh: %s, want unauthorized", code)
		}
	}
	if code := rest(b, tok); code != 429 {
		t.Errorf("valid REST token after forged refreshes spent the budget: %d, want 429", code)
	}
	if code, _ := handshakeFrom(t, m, b, tok, ""); code != gateway.CloseTryAgainLater {
		t.Errorf("valid handshake after forged refreshes spent the budget: close %d, want 1013", code)
	}
	cb.stillOpen()

	// c: two units spent, then another user's valid token closes the
	// connection without spending the last one.
	cc := connectFrom(t, m, c, tok)
	for range 2 {
		if code, _ := cc.refreshAnswer(forged); code != "unauthorized" {
			t.Fatalf("forged refresh: %s, want unauthorized", code)
		}
	}
	cc.send(`{"type":"refresh","token":"` + userToken(t, ids.New()) + `"}`)
	if code := cc.closeStatus(10 * time.Second); code != gateway.CloseForbidden {
		t.Fatalf("another user's token: close %d, want 4003", code)
	}
	if code := rest(c, tok); code != 200 {
		t.Errorf("valid REST token after a refresh with another user's token: %d, want 200 (the budget keeps its last unit)", code)
	}
}
