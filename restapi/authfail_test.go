package restapi_test

import (
	"context"
	"io"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// countingVerifier counts the tokens it is asked to verify.
type countingVerifier struct {
	v     restapi.TokenVerifier
	calls atomic.Int64
}

func (c *countingVerifier) Verify(ctx context.Context, tok string) (auth.Principal, error) {
	c.calls.Add(1)
	return c.v.Verify(ctx, tok)
}

// proxiedHarness is a server behind a trusted proxy on loopback, so each
// request names its client address in X-Forwarded-For, with a verifier
// that counts its calls; edit, if not nil, changes its Config first.
func (h *harness) proxiedHarness(edit func(*restapi.Config)) (*harness, *countingVerifier) {
	cv := &countingVerifier{}
	return h.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime = h.rdb, h.rt
		d.Config.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
		if edit != nil {
			edit(&d.Config)
		}
		cv.v = devVerifier(h.t, d.Redis, d.Logger)
		d.Verifier = cv
	}), cv
}

// from sends GET /v1/me with the Authorization header auth (none when
// empty) as the client at addr.
func (h *harness) from(addr, authz string) (int, []byte, string) {
	h.t.Helper()
	hdr := map[string]string{"X-Forwarded-For": addr}
	if authz != "" {
		hdr["Authorization"] = authz
	}
	code, b, head := h.doH("", "GET", "/v1/me", "", hdr)
	return code, b, head.Get("Retry-After")
}

// forgedToken is a well-formed user token signed with another secret.
func forgedToken(t *testing.T) string {
	t.Helper()
	tok, err := auth.MintDevToken([]byte("not-the-dev-secret-0123456789abcdef"), auth.DevClaims{Subject: ids.New(), Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A client repeating forged tokens gets 401 up to its address's budget of
// refused credentials (20 by default), then 429 rate_limited with
// Retry-After, and those 429s cost no signature check: every token the
// server verified was answered 401. Another address is unaffected, and a
// valid token from a fresh address works.
func TestForgedTokensPastTheBudgetAreNotVerified(t *testing.T) {
	h, cv := newHarness(t).proxiedHarness(nil)
	forged := "Bearer " + forgedToken(t)
	const attacker = "198.51.100.7"
	first, refused, limited := 0, 0, 0 // 401s before the first 429, 401s, 429s
	for i := 0; i < 200 && limited < 10; i++ {
		code, b, retry := h.from(attacker, forged)
		switch code {
		case 401: // before the first 429, or a unit the budget refilled meanwhile
			wantError(t, code, b, 401, "unauthorized")
			refused++
			if limited == 0 {
				first++
			}
		case 429:
			wantError(t, code, b, 429, "rate_limited")
			if n, err := strconv.Atoi(retry); err != nil || n < 1 {
				t.Fatalf("429 with Retry-After %q", retry)
			}
			limited++
		default:
			t.Fatalf("forged token: %d %s", code, b)
		}
	}
	if first < 20 || limited < 10 {
		t.Fatalf("%d answers 401 before the first 429, %d answers 429: want at least 20 and 10", first, limited)
	}
	// Each 401 verified its token once; no 429 verified one.
	if got := cv.calls.Load(); got != int64(refused) {
		t.Fatalf("%d verifications for %d answers 401 and %d answers 429", got, refused, limited)
	}
	calls := cv.calls.Load()
	code, b, _ := h.from("198.51.100.8", forged)
	wantError(t, code, b, 401, "unauthorized")
	if cv.calls.Load() != calls+1 {
		t.Fatal("another address's forged token was not verified")
	}
	_, tok := h.user()
	if code, b, _ := h.from("198.51.100.9", "Bearer "+tok); code != 200 {
		t.Fatalf("valid token from a fresh address: %d %s", code, b)
	}
}
