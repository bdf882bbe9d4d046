package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

func TestHandshakeAuthAndOrigin(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(1)[0]
	wantClose := func(t *testing.T, c *client, code websocket.StatusCode) {
		t.Helper()
		got, reason := c.closeStatus(10 * time.Second)
		if got != code {
			t.Fatalf("close code %d (%q), want %d", got, reason, code)
		}
	}

	t.Run("ticket with allowed origin, once", func(t *testing.T) {
		tk, exp := in.ticket(u)
		now := time.Now().UnixMilli()
		if exp < now+25_000 || exp > now+35_000 {
			t.Fatalf("expiresAt %d is not about 30 s ahead of %d", exp, now)
		}
		c := in.connectWith(dialOpts{ticket: tk, origin: testOrigin})
		if h := c.expect("hello"); h.ConnectionID == "" {
			t.Fatalf("hello: %s", h.raw)
		}
		// The same ticket again: 4001.
		wantClose(t, in.connectWith(dialOpts{ticket: tk, origin: testOrigin}), gateway.CloseUnauthorized)
	})
	t.Run("disallowed origin", func(t *testing.T) {
		tk, _ := in.ticket(u)
		wantClose(t, in.connectWith(dialOpts{ticket: tk, origin: "https://evil.example"}), gateway.ClosePolicy)
		// The refusal happened before redemption: the ticket still works.
		c := in.connectWith(dialOpts{ticket: tk, origin: testOrigin})
		c.expect("hello")
		// A same-host origin is not special (the library would accept it).
		wantClose(t, in.connectWith(dialOpts{token: token(t, u), origin: in.srv.URL}), gateway.ClosePolicy)
	})
	t.Run("ticket without origin", func(t *testing.T) {
		tk, _ := in.ticket(u)
		wantClose(t, in.connectWith(dialOpts{ticket: tk}), gateway.ClosePolicy)
	})
	t.Run("bearer without origin is accepted", func(t *testing.T) {
		c := in.connectWith(dialOpts{token: token(t, u)})
		c.expect("hello")
	})
	t.Run("bad credentials", func(t *testing.T) {
		wantClose(t, in.connectWith(dialOpts{}), gateway.CloseUnauthorized)
		wantClose(t, in.connectWith(dialOpts{token: "not.a.token"}), gateway.CloseUnauthorized)
		wantClose(t, in.connectWith(dialOpts{ticket: strings.Repeat("A", 43), origin: testOrigin}), gateway.CloseUnauthorized)
		svc, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: ids.New(), Kind: auth.KindService, Service: "inbox", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		wantClose(t, in.connectWith(dialOpts{token: svc}), gateway.CloseForbidden)
	})
	t.Run("subprotocol required", func(t *testing.T) {
		wantClose(t, in.connectWith(dialOpts{token: token(t, u), noSub: true}), gateway.ClosePolicy)
	})
	t.Run("frame over 4 KiB", func(t *testing.T) {
		c := in.connect(u)
		c.send(`{"type":"ping","pad":"` + strings.Repeat("x", 4100) + `"}`)
		wantClose(t, c, gateway.ClosePolicy)
	})
	t.Run("a 4 KiB frame is fine", func(t *testing.T) {
		c := in.connect(u)
		f := `{"type":"ping","pad":"`
		c.send(f + strings.Repeat("x", 4096-len(f)-2) + `"}`)
		c.expect("pong")
	})
	t.Run("unknown frame type and bad frames", func(t *testing.T) {
		c := in.connect(u)
		for _, tc := range []struct{ in, code string }{
			{`{"type":"dance"}`, "unknown_type"},
			{`not json`, "invalid_frame"},
			{`{"type":"ping","type":"ping"}`, "invalid_frame"},
			{`{"type":"subscribe","dialogId":"nope"}`, "invalid_uuid"},
			{`{"type":"subscribe","dialogId":"` + ids.New() + `"}`, "dialog_not_found"},
			{`{"type":"typing","dialogId":"` + ids.New() + `"}`, "not_subscribed"},
		} {
			c.sendRaw(tc.in)
			if f := c.expect("error"); f.Error != tc.code || string(f.raw) != `{"type":"error","error":"`+tc.code+`"}` {
				t.Fatalf("%s: got %s, want error %s", tc.in, f.raw, tc.code)
			}
		}
		c.send(`{"type":"ping"}`)
		c.expect("pong")
	})
	t.Run("binary frame", func(t *testing.T) {
		c := in.connect(u)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.ws.Write(ctx, websocket.MessageBinary, []byte("x"))
		wantClose(t, c, gateway.CloseUnsupported)
	})
	t.Run("frame rate", func(t *testing.T) {
		c := in.connect(u)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for i := 0; i < 200; i++ {
			if err := c.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ping"}`)); err != nil {
				break
			}
		}
		got, _ := c.closeStatus(10 * time.Second)
		if got != gateway.ClosePolicy {
			t.Fatalf("flooding client: close %d (%v), want 1008", got, c.err)
		}
	})
	st := in.svc.Stats()
	if st.Rejects["origin"] < 3 || st.Rejects["unauthorized"] < 4 || st.Closes[int(gateway.ClosePolicy)] == 0 {
		t.Fatalf("rejection metrics: %+v", st)
	}
}
