package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// A keyed write's idempotency script waits HAN_IDEMPOTENCY_LINGER for the
// scripts of other requests before it goes to Redis, within its
// HAN_REDIS_TIMEOUT. A linger at or above that budget started, and then
// every keyed send that came alone answered 503: its script was never
// sent. Such a linger is refused at start-up naming both variables; the
// largest one taken, a quarter of the budget, serves keyed sends.
func TestIdempotencyLingerWithinTheRedisBudget(t *testing.T) {
	vars := baseEnv()
	vars["HAN_REDIS_TIMEOUT"], vars["HAN_IDEMPOTENCY_LINGER"] = "90ms", "100ms"
	err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] })
	if err == nil || !strings.Contains(err.Error(), "HAN_IDEMPOTENCY_LINGER: must be at most a quarter of HAN_REDIS_TIMEOUT") {
		t.Errorf("HAN_IDEMPOTENCY_LINGER=100ms, HAN_REDIS_TIMEOUT=90ms: %v, want a refusal; it started and lone keyed sends answered %v",
			err, keyedSends(t, vars))
	}
	vars["HAN_REDIS_TIMEOUT"] = "400ms"
	if codes := keyedSends(t, vars); codes != "201 201 201" {
		t.Errorf("HAN_IDEMPOTENCY_LINGER=100ms, HAN_REDIS_TIMEOUT=400ms: lone keyed sends answered %s", codes)
	}
}

// keyedSends starts an instance with vars and returns the statuses of
// three keyed sends, one after the other (each alone in its pipeline).
func keyedSends(t *testing.T, vars map[string]string) string {
	t.Helper()
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	tok := userToken(t, alice)
	dialogID := restDialog(t, m, tok, bob)
	var codes []string
	for i := range 3 {
		code, _ := callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", tok, fmt.Sprintf(`{"body":"lone %d"}`, i),
			map[string]string{"Idempotency-Key": ids.New(), "Content-Type": "application/json"})
		codes = append(codes, fmt.Sprint(code))
	}
	return strings.Join(codes, " ")
}

// A setting beyond its range stops the program before it opens anything,
// with an error naming the variable.
func TestOutOfRangeSettingsStopStartUp(t *testing.T) {
	for name, v := range map[string]string{
		"HAN_REDIS_TIMEOUT": "11s", "HAN_SHUTDOWN_TIMEOUT": "2h", "HAN_DRAIN_DELAY": "11m", "HAN_OUTBOX_GRACE": "11m",
		"HAN_OUTBOX_RETENTION": "169h", "HAN_IDEMPOTENCY_TTL": "169h", "HAN_ATTACHMENT_UNSENT_TTL": "721h",
		"HAN_WS_HANDSHAKE_WAIT": "2m", "HAN_HTTP_IDLE_TIMEOUT": "2h", "HAN_WS_RECOVER_MAX": "9223372036854775807",
		"HAN_IDEMPOTENCY_LINGER": "100ms", "HAN_WS_LINGER": "100ms",
		"HAN_WS_RECOVER_READ_RATE": "NaN", "HAN_WS_RECOVER_READ_BURST": "0",
	} {
		vars := baseEnv()
		if name != "HAN_REDIS_TIMEOUT" {
			vars["HAN_REDIS_TIMEOUT"] = "300ms" // the lingers' budget: 100ms is over a quarter of it
		}
		vars[name] = v
		err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] })
		if err == nil || !strings.Contains(err.Error(), name+": must be") {
			t.Errorf("%s=%s: %v, want a refusal naming it", name, v, err)
		}
	}
}

// The -addr flag is checked as HAN_HTTP_ADDR is, and it, not
// HAN_HTTP_ADDR, is where the API listens: a metrics address on its port
// is refused before anything starts.
func TestAddrFlagIsCheckedAsHTTPAddr(t *testing.T) {
	vars := baseEnv()
	vars["HAN_HTTP_ADDR"] = "127.0.0.1:0"
	for _, tc := range []struct {
		addr, metrics, want string
	}{
		{"127.0.0.1:8080 ", "", "HAN_HTTP_ADDR (or -addr): must be host:port"},
		{"127.0.0.1:18080", "127.0.0.1:18080", "HAN_METRICS_ADDR: must differ from HAN_HTTP_ADDR (or -addr"},
	} {
		vars["HAN_METRICS_ADDR"] = tc.metrics
		err := NewMain().ParseFlags([]string{"-addr", tc.addr}, func(k string) string { return vars[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-addr %q, HAN_METRICS_ADDR %q: %v, want %q", tc.addr, tc.metrics, err, tc.want)
		}
	}
	vars["HAN_METRICS_ADDR"] = ""
	m := NewMain()
	if err := m.ParseFlags([]string{"-addr", "127.0.0.1:18080"}, func(k string) string { return vars[k] }); err != nil || m.Config.HTTPAddr != "127.0.0.1:18080" {
		t.Errorf("-addr 127.0.0.1:18080: %v, listen address %q", err, m.Config.HTTPAddr)
	}
}
