package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
)

// handshakeOutcome dials with a bearer token and reads the first frame:
// "hello" (the socket is then closed by the client), or the refusal's
// close code and reason.
func handshakeOutcome(t *testing.T, in *instance, tok string) (hello bool, code websocket.StatusCode, reason string) {
	t.Helper()
	ws, _, err := in.dialRaw(dialOpts{token: tok})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer ws.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := ws.Read(ctx)
	if err == nil {
		if !strings.Contains(string(b), `"type":"hello"`) {
			t.Fatalf("first frame %s, want hello", b)
		}
		return true, 0, ""
	}
	var ce websocket.CloseError
	if !asCloseError(err, &ce) {
		t.Fatalf("handshake ended with %v, want hello or a close frame", err)
	}
	return false, ce.Code, ce.Reason
}

// One user connecting and closing in a loop with a valid token gets the
// burst and then the rate of handshakes; the rest are closed with 1013 and
// a reconnect delay that covers the wait for the next token, before any
// presence work. Another user's handshake meanwhile is admitted at once,
// and the looping user is admitted again once a token is back.
func TestOneUsersHandshakeLoopIsRateLimited(t *testing.T) {
	pool := openPool(t)
	const rate, burst, tries = 4.0, 5, 40
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) {
		c.UserHandshakeRate, c.UserHandshakeBurst = rate, burst
		c.RetryMin, c.RetryMax = 100*time.Millisecond, 200*time.Millisecond
	}})
	u := ids.New()
	tok := token(t, u)
	accepted, limited := 0, 0
	start := time.Now()
	for range tries {
		hello, code, reason := handshakeOutcome(t, in, tok)
		if hello {
			accepted++
			continue
		}
		var advice struct {
			RetryMs *int64 `json:"retryMs"`
		}
		if code != gateway.CloseTryAgainLater || json.Unmarshal([]byte(reason), &advice) != nil || advice.RetryMs == nil ||
			*advice.RetryMs < 100 || *advice.RetryMs > 200+int64(1000/rate)+1 {
			t.Fatalf("a handshake over the user's rate closed with %d %q, want 1013 {\"retryMs\":n}, n in [100, %d]",
				code, reason, 200+int64(1000/rate)+1)
		}
		limited++
	}
	elapsed := time.Since(start)
	if most := burst + int(rate*elapsed.Seconds()) + 1; accepted > most || accepted < burst {
		t.Fatalf("%d of %d handshakes in %v accepted, want %d to %d (burst %d, %v a second)",
			accepted, tries, elapsed.Round(time.Millisecond), burst, most, burst, rate)
	}
	if limited == 0 {
		t.Fatal("no handshake was limited")
	}
	if st := in.svc.Stats(); st.Rejects["handshake_rate"] != uint64(limited) {
		t.Fatalf("han_ws_rejected_total{reason=\"handshake_rate\"} = %d, want %d", st.Rejects["handshake_rate"], limited)
	}
	if hello, code, reason := handshakeOutcome(t, in, token(t, ids.New())); !hello {
		t.Fatalf("another user's handshake closed with %d %q while one user was limited", code, reason)
	}
	time.Sleep(time.Duration(float64(time.Second) / rate))
	if hello, code, reason := handshakeOutcome(t, in, tok); !hello {
		t.Fatalf("the limited user's handshake a token later closed with %d %q", code, reason)
	}
}
