package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// serverLeeway is the verifier's default leeway on exp (Main does not
// change it): a socket ends at its token's exp plus this.
const serverLeeway = 30 * time.Second

// wsLog records the WebSocket frames a page sends and receives (DevTools
// network events), so a test sees the protocol the client speaks.
type wsLog struct {
	mu       sync.Mutex // guards sent, received
	sent     []string
	received []string
}

func (l *wsLog) has(sent bool, substr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	frames := l.received
	if sent {
		frames = l.sent
	}
	for _, f := range frames {
		if strings.Contains(f, substr) {
			return true
		}
	}
	return false
}

// recordWebSocket starts recording; call it before the page opens a socket.
func (p *page) recordWebSocket() *wsLog {
	p.t.Helper()
	l := &wsLog{}
	if err := chromedp.Listen(p.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *network.EventWebSocketFrameSent:
			l.mu.Lock()
			l.sent = append(l.sent, string(ev.Response.PayloadData))
			l.mu.Unlock()
		case *network.EventWebSocketFrameReceived:
			l.mu.Lock()
			l.received = append(l.received, string(ev.Response.PayloadData))
			l.mu.Unlock()
		}
	}); err != nil {
		p.t.Fatalf("%s: listen: %v", p.name, err)
	}
	p.do("enable network events", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{})
		return err
	}))
	return l
}

// ticketRequests counts the page's POST /v1/realtime/tickets, i.e. its
// connection attempts.
func ticketRequests(p *page) int {
	p.t.Helper()
	return mustEval[int](p, `performance.getEntriesByType("resource").filter((e) => e.name.includes("/v1/realtime/tickets")).length`)
}

func mintTTL(t *testing.T, sub string, ttl time.Duration) string {
	t.Helper()
	s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// browserTokenRefresh: a socket lives as long as its token. Carol signs in
// with a token whose exp has just passed (the server still accepts it for
// the rest of its leeway); the client asks for a new token at once, refuses
// another user's token itself, sends the right one in band and keeps the
// same connection past the old token's end. Dave does not answer: his
// socket is closed with 4001 token_expired, the client does not reconnect
// with the dead token, and a new one brings him back.
func browserTokenRefresh(t *testing.T, b *browser, m *Main) {
	carol, dave, stranger := ids.New(), ids.New(), ids.New()
	live := `document.querySelector("#conn")?.dataset.phase === "live"`

	// Carol: exp 10 s ago, so the socket would end 20 s from now.
	c := b.newPage(t, "carol")
	frames := c.recordWebSocket()
	oldEnd := time.Now().Add(-10 * time.Second).Truncate(time.Second).Add(serverLeeway)
	c.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintTTL(t, carol, -10*time.Second)))
	c.confirmLinkSignIn()
	c.waitJS(deliveryBound, "carol live", live)
	c.waitJS(deliveryBound, "new token asked for", `document.querySelector("#renew")?.dataset.reason === "expiring"`)
	c.shot("renew-asked")

	c.setValue("#renew-token", mintTTL(t, stranger, time.Hour))
	c.click("#renew-btn")
	c.waitJS(deliveryBound, "another user's token refused", `document.querySelector("#renew-error-alert")?.dataset.code === "token_user_mismatch"`)
	if frames.has(true, `"type":"refresh"`) {
		t.Fatal("the client sent another user's token")
	}

	c.setValue("#renew-token", mintTTL(t, carol, time.Hour))
	c.click("#renew-btn")
	c.waitJS(deliveryBound, "renew card gone", `!document.querySelector("#renew")`)
	testenv.Eventually(t, deliveryBound, func() bool {
		return frames.has(true, `"type":"refresh"`) && frames.has(false, `"type":"refreshed"`)
	}, "carol: no refresh frame sent and answered")
	if got := ticketRequests(c); got != 1 {
		t.Fatalf("carol made %d ticket requests, want 1 (one connection)", got)
	}

	// Past the old token's end (plus the server's one-second check): still
	// the same connection, and REST works with the new token.
	time.Sleep(time.Until(oldEnd.Add(3 * time.Second)))
	c.waitJS(deliveryBound, "carol still live", live)
	if got := ticketRequests(c); got != 1 {
		t.Fatalf("carol reconnected (%d ticket requests) although she refreshed", got)
	}
	c.click("#refresh-dialogs")
	c.waitJS(deliveryBound, "still signed in after REST", `!document.querySelector("#me").hidden && !document.querySelector("#signin-form")`)
	c.shot("refreshed")
	c.noJSErrors()

	// Dave: exp 25 s ago, so the socket ends about 5 s from now.
	d := b.newPage(t, "dave")
	d.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintTTL(t, dave, -25*time.Second)))
	d.confirmLinkSignIn()
	d.waitJS(deliveryBound, "dave live", live)
	d.waitJS(deliveryBound, "new token asked for", `document.querySelector("#renew")`)
	d.waitJS(serverLeeway, "closed with token_expired",
		`document.querySelector("#conn")?.dataset.phase === "stopped" && document.querySelector("#conn").textContent.includes("token_expired")`)
	d.waitJS(deliveryBound, "the card says the session ended", `document.querySelector("#renew")?.dataset.reason === "expired"`)
	d.shot("expired")
	time.Sleep(3 * time.Second) // a client that reconnected with the dead token would have tried by now
	if got := ticketRequests(d); got != 1 {
		t.Fatalf("dave made %d ticket requests after token_expired, want none after the first", got)
	}
	d.setValue("#renew-token", mintTTL(t, dave, time.Hour))
	d.click("#renew-btn")
	d.waitJS(deliveryBound, "dave live again with the new token", live+` && !document.querySelector("#renew")`)
	if got := ticketRequests(d); got != 2 {
		t.Fatalf("dave made %d ticket requests, want 2 (the new token's connection)", got)
	}
	d.noJSErrors()
}
