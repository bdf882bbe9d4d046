package restapi_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
)

// ipLimited is a server on base's database and DB0 with the given route
// policies (unknown routes unlimited) and trusted proxies.
func ipLimited(t *testing.T, base *harness, routes map[string]ratelimit.Policy, trusted ...string) *harness {
	t.Helper()
	metrics := restapi.NewMetrics()
	lim, err := ratelimit.New(ratelimit.Config{
		Redis: base.rdb, Policies: ratelimit.Static{Set: ratelimit.MustPolicySet("ip-test", routes, ratelimit.Policy{})},
		Registerer: metrics.Registry,
	})
	if err != nil {
		t.Fatal(err)
	}
	var prefixes []netip.Prefix
	for _, p := range trusted {
		prefixes = append(prefixes, netip.MustParsePrefix(p))
	}
	return base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime = base.rdb, base.rt
		d.Metrics = metrics
		d.RateLimits = lim
		d.Config.TrustedProxies = prefixes
	})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// A client behind a trusted proxy cannot choose who it is counted as. The
// proxy is a reverse proxy on the same machine, listed as trusted, and it
// writes X-Forwarded-For; the client adds a Forwarded header of its own.
// That header is ignored, so the client stays remote for the loopback-only
// debug endpoints and stays in its own ip bucket. (Before, two headers that
// disagreed made the request count as the proxy's loopback address.)
func TestAClientCannotBecomeItsTrustedProxy(t *testing.T) {
	base := newHarness(t)
	w := 63_017 * time.Millisecond
	h := ipLimited(t, base, map[string]ratelimit.Policy{
		"GET /v1/public/config": {Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FallbackLocal,
			Rules: []ratelimit.Rule{{Family: ratelimit.FamilyIP, Limit: 1, Window: w}}},
	}, "127.0.0.1/32", "::1/128")

	// (1) the address the debug guard asks.
	r, _ := http.NewRequest("GET", "/debug/pprof/", nil)
	r.RemoteAddr = "127.0.0.1:40000"
	r.Header.Set("X-Forwarded-For", "203.0.113.7") // appended by the proxy
	r.Header.Set("Forwarded", "for=198.51.100.1")  // written by the client
	if a := h.api.ClientAddr(r); a.IsLoopback() {
		t.Errorf("remote client 203.0.113.7 + its own Forwarded header through a trusted loopback proxy: ClientAddr = %s (loopback: debug endpoints open to it)", a)
	}

	// (2) the ip bucket: one request per window from this client.
	client := fmt.Sprintf("203.0.%d.%d", 1+int(randHex(1)[0])%200, 1+int(randHex(1)[1])%200)
	xff := map[string]string{"X-Forwarded-For": client}
	if code, b, _ := h.doH("", "GET", "/v1/public/config", "", xff); code != 200 {
		t.Fatalf("first request: %d %s", code, b)
	}
	code, b, _ := h.doH("", "GET", "/v1/public/config", "", xff)
	wantError(t, code, b, 429, "rate_limited")
	for i := range 3 {
		code, b, _ := h.doH("", "GET", "/v1/public/config", "", map[string]string{
			"X-Forwarded-For": client, "Forwarded": fmt.Sprintf("for=192.0.2.%d", i+1)})
		if code != 429 {
			t.Errorf("over its ip limit, client %s adding its own Forwarded header (try %d): %d %s, want 429", client, i, code, b)
			break
		}
	}
}

// The ip family counts an IPv6 client as its /64: a host owns at least
// that much and may rotate addresses inside it, and with one bucket per
// address each request met a fresh one.
func TestAnIPv6ClientRotatingInsideItsSlash64SharesTheIPLimit(t *testing.T) {
	base := newHarness(t)
	w := 63_019 * time.Millisecond
	h := ipLimited(t, base, map[string]ratelimit.Policy{
		"GET /v1/public/config": {Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FallbackLocal,
			Rules: []ratelimit.Rule{{Family: ratelimit.FamilyIP, Limit: 2, Window: w}}},
	}, "127.0.0.1/32", "::1/128")
	p := randHex(2)
	prefix := "2001:db8:" + p[:4] + ":" + "77" // one /64 of this run
	admitted := 0
	for i := range 10 {
		addr := fmt.Sprintf("%s::%x", prefix, i+1)
		code, b, _ := h.doH("", "GET", "/v1/public/config", "", map[string]string{"X-Forwarded-For": addr})
		switch code {
		case 200:
			admitted++
		case 429:
		default:
			t.Fatalf("%s: %d %s", addr, code, b)
		}
	}
	if admitted > 2 {
		t.Fatalf("ip limit 2 per window, one client in %s::/64 rotating addresses: %d of 10 admitted", prefix, admitted)
	}
}
