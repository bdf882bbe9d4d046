package restapi_test

import (
	"fmt"
	"testing"

	"github.com/han-app/gateway/restapi"
)

// metricValue is the value of the series of the metric name whose one
// label is value ("" for a metric without labels).
func (h *harness) metricValue(name, value string) float64 {
	h.t.Helper()
	mfs, err := h.api.Metrics().Registry.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 0 && value == "" || len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	h.t.Fatalf("no series %s %q", name, value)
	return 0
}

// slowBudget is a budget of burst refusals that refills one unit in
// 1000 s: nothing refills while a test runs.
func slowBudget(burst, addresses int) func(*restapi.Config) {
	return func(c *restapi.Config) {
		c.AuthFailures = restapi.AuthFailConfig{Burst: burst, Rate: 0.001, MaxAddresses: addresses}
	}
}

// Only refused credentials spend an address's budget: valid tokens never
// do, a request without a token does. While the address is over its
// budget, every request from it to a route that needs a token is 429
// without its token being verified, a valid one included (users behind
// the same NAT share it). An IPv6 client is counted as its /64.
func TestAuthFailBudgetCountsRefusalsOnly(t *testing.T) {
	h, cv := newHarness(t).proxiedHarness(slowBudget(3, 0))
	_, valid := h.user()
	validAuth, forged := "Bearer "+valid, "Bearer "+forgedToken(t)
	const a = "203.0.113.10"
	for i := range 10 {
		if code, b, _ := h.from(a, validAuth); code != 200 {
			t.Fatalf("valid token %d: %d %s", i, code, b)
		}
	}
	for range 3 {
		code, b, _ := h.from(a, forged)
		wantError(t, code, b, 401, "unauthorized")
	}
	calls := cv.calls.Load()
	for _, authz := range []string{forged, validAuth, "", "Basic abc"} {
		code, b, retry := h.from(a, authz)
		wantError(t, code, b, 429, "rate_limited")
		if retry != "1000" {
			t.Errorf("Retry-After %q, want 1000 (one unit refills in 1000 s)", retry)
		}
	}
	if cv.calls.Load() != calls {
		t.Fatal("a request over the budget was verified")
	}

	// Requests without a token spend the budget too.
	const b = "203.0.113.11"
	for range 3 {
		code, body, _ := h.from(b, "")
		wantError(t, code, body, 401, "unauthorized")
	}
	code, body, _ := h.from(b, forged)
	wantError(t, code, body, 429, "rate_limited")
	if cv.calls.Load() != calls {
		t.Fatal("a request without a token, or over the budget, was verified")
	}

	// One IPv6 /64 is one client; the next /64 is another.
	for range 3 {
		code, body, _ := h.from("2001:db8:1:2::1", forged)
		wantError(t, code, body, 401, "unauthorized")
	}
	code, body, _ = h.from("2001:db8:1:2:ffff::9", forged)
	wantError(t, code, body, 429, "rate_limited")
	code, body, _ = h.from("2001:db8:1:3::1", forged)
	wantError(t, code, body, 401, "unauthorized")

	for _, c := range []struct {
		result string
		want   float64
	}{{"refused", 7}, {"missing", 3}, {"limited", 6}} {
		if got := h.metricValue("han_http_auth_failures_total", c.result); got != c.want {
			t.Errorf("han_http_auth_failures_total{result=%q} = %v, want %v", c.result, got, c.want)
		}
	}
}

// The budget holds at most its cap of addresses. Past it, an address is not
// limited: 2,000 addresses with one forged token each are all verified, a
// valid token from a fresh address is served while the map is full (a
// client rotating addresses cannot lock out clients that never failed),
// and the addresses within the cap keep their own budgets.
func TestAuthFailBudgetIsBounded(t *testing.T) {
	const burst, capacity, clients = 2, 50, 2000
	h, cv := newHarness(t).proxiedHarness(slowBudget(burst, capacity))
	_, valid := h.user()
	calls := cv.calls.Load()
	forged := "Bearer " + forgedToken(t)
	addr := func(i int) string { return fmt.Sprintf("10.%d.%d.1", i/250, i%250) }
	refused, limited := 0, 0
	for i := range clients {
		switch code, b, _ := h.from(addr(i), forged); code {
		case 401:
			refused++
		case 429:
			limited++
		default:
			t.Fatalf("%s: %d %s", addr(i), code, b)
		}
	}
	if refused != clients || limited != 0 {
		t.Fatalf("%d answers 401 and %d answers 429, want %d and 0", refused, limited, clients)
	}
	if got := cv.calls.Load() - calls; got != int64(refused) {
		t.Fatalf("%d verifications for %d answers 401", got, refused)
	}
	if n := h.metricValue("han_http_auth_fail_addresses", ""); n != capacity {
		t.Fatalf("han_http_auth_fail_addresses = %v, want the cap %d", n, capacity)
	}
	// A fresh address with a valid token is served while the map is full.
	if code, b, _ := h.from("10.200.0.1", "Bearer "+valid); code != 200 {
		t.Fatalf("valid token from a fresh address while the map is full: %d %s", code, b)
	}
	// An address with a budget of its own keeps what is left of it: one
	// more refusal spends its burst of 2, then it is limited.
	if code, b, _ := h.from(addr(0), forged); code != 401 {
		t.Fatalf("second forged token from an address within the cap: %d %s", code, b)
	}
	if code, b, _ := h.from(addr(0), forged); code != 429 {
		t.Fatalf("third forged token from an address within the cap: %d %s, want 429", code, b)
	}
}
