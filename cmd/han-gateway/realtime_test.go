package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// The real program serves the realtime endpoint next to the REST API, and
// Close drains sockets with 1001 + {"retryMs":n} before the HTTP server
// stops.
func TestEndToEndRealtime(t *testing.T) {
	vars := baseEnv()
	vars["HAN_SHUTDOWN_TIMEOUT"] = "5s"
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
	dialogID := body[strings.Index(body, `"id":"`)+6:][:36]

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wsURL := "ws://" + m.Addr() + "/v1/realtime"
	dial := func(u string, h http.Header) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"han.v1"}, HTTPHeader: h})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	read := func(c *websocket.Conn) map[string]any {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Bob: bearer, no Origin (a non-browser client).
	bc := dial(wsURL, http.Header{"Authorization": {"Bearer " + bTok}})
	if f := read(bc); f["type"] != "hello" || f["instance"] != m.Config.InstanceID {
		t.Fatalf("hello: %v", f)
	}
	// Alice: a browser, with a ticket and an allowed Origin.
	code, body = call(t, "POST", m.URL()+"/v1/realtime/tickets", aTok, "")
	if code != 201 {
		t.Fatalf("ticket: %d %s", code, body)
	}
	var tk struct{ Ticket string }
	_ = json.Unmarshal([]byte(body), &tk)
	ac := dial(wsURL+"?ticket="+tk.Ticket, http.Header{"Origin": {"http://localhost:8080"}})
	if f := read(ac); f["type"] != "hello" {
		t.Fatalf("hello: %v", f)
	}
	if err := bc.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+dialogID+`"}`)); err != nil {
		t.Fatal(err)
	}
	if f := read(bc); f["type"] != "subscribed" || f["lastSeq"] != float64(0) {
		t.Fatalf("subscribed: %v", f)
	}
	req, _ := http.NewRequest("POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", strings.NewReader(`{"body":"hi bob"}`))
	req.Header.Set("Authorization", "Bearer "+aTok)
	req.Header.Set("Idempotency-Key", ids.New())
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("send: %v %v", resp, err)
	}
	resp.Body.Close()
	for {
		f := read(bc)
		if f["type"] == "event" && f["event"] == "message.created" {
			if f["seq"] != float64(1) {
				t.Fatalf("event: %v", f)
			}
			break
		}
	}
	if code, body := call(t, "GET", m.URL()+"/readyz", "", ""); code != 200 || !strings.Contains(body, `"pubsub":"ok"`) {
		t.Fatalf("/readyz: %d %s", code, body)
	}

	// Clients keep reading (as browsers do) so they answer the close
	// handshake at once.
	closes := make(chan websocket.CloseError, 2)
	for _, c := range []*websocket.Conn{ac, bc} {
		go func() {
			for {
				if _, _, err := c.Read(ctx); err != nil {
					var ce websocket.CloseError
					errors.As(err, &ce)
					closes <- ce
					return
				}
			}
		}()
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ce := <-closes
		var v struct{ RetryMs *int }
		if ce.Code != websocket.StatusGoingAway || json.Unmarshal([]byte(ce.Reason), &v) != nil || v.RetryMs == nil {
			t.Fatalf("drain close: %d %q", ce.Code, ce.Reason)
		}
	}
}
