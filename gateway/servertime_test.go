package gateway_test

import (
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
)

// hello and refreshed carry the server's clock (epoch ms) at the time they
// are sent, so a client whose own clock is off can measure expiresAt on the
// server's clock: the value lies between the test's readings of the same
// clock before the frame was asked for and after it arrived.
func TestHelloAndRefreshedCarryServerTime(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(1)[0]

	before := time.Now().UnixMilli()
	c := in.connect(u)
	h := c.hello
	after := time.Now().UnixMilli()
	if h.ServerTime < before || h.ServerTime > after {
		t.Fatalf("hello serverTime %d, want within [%d, %d]: %s", h.ServerTime, before, after, h.raw)
	}

	tok, exp := mint(t, u, auth.KindUser, time.Hour)
	before = time.Now().UnixMilli()
	c.send(`{"type":"refresh","token":"` + tok + `"}`)
	f := c.expect("refreshed")
	after = time.Now().UnixMilli()
	if f.ExpiresAt != exp.UnixMilli() || f.ServerTime < before || f.ServerTime > after {
		t.Fatalf("refreshed %s, want expiresAt %d and serverTime within [%d, %d]", f.raw, exp.UnixMilli(), before, after)
	}
}
