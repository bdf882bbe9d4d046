package config

import (
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"
)

// refused loads base() with vars set and fails the test unless the load
// is refused with a message naming name.
func refused(t *testing.T, name string, vars map[string]string) string {
	t.Helper()
	m := base()
	for k, v := range vars {
		m[k] = v
	}
	_, err := Load(env(m))
	if err == nil || !strings.Contains(err.Error(), name+":") {
		t.Errorf("%v: %v, want a refusal naming %s", vars, err, name)
		return ""
	}
	return err.Error()
}

// accepted loads base() with vars set and returns the configuration.
func accepted(t *testing.T, vars map[string]string) Config {
	t.Helper()
	m := base()
	for k, v := range vars {
		m[k] = v
	}
	c, err := Load(env(m))
	if err != nil {
		t.Errorf("%v: refused: %v", vars, err)
	}
	return c
}

// HAN_ENV and HAN_INSTANCE_ID are names of letters, digits, '.', '_' and
// '-'. A carriage return (an env file saved with CRLF line ends and read by
// docker --env-file, a ConfigMap or a shell), a vertical tab, a form feed
// or a no-break space passed the old check: "prod\r" was then not
// production, the dev HS256 secret was accepted and no public realtime URL
// required, without a word, and the keys carried the "\r".
func TestEnvAndInstanceIDAreNames(t *testing.T) {
	for _, v := range []string{"prod\r", "prod\v", "prod\f", "prod\u00a0", "production\r", "pr od", "a:b", "a{b}", "prød", "prod\x00"} {
		refused(t, "HAN_ENV", map[string]string{"HAN_ENV": v})
		refused(t, "HAN_INSTANCE_ID", map[string]string{"HAN_INSTANCE_ID": v})
	}
	for _, v := range []string{"dev", "stage-2", "eu_west.1", "PROD"} {
		accepted(t, map[string]string{"HAN_INSTANCE_ID": v, "HAN_ENV": v, "HAN_PUBLIC_REALTIME_URL": "wss://rt.example.com/v1/realtime",
			"HAN_JWT_DEV_HS256_SECRET": "", "HAN_JWKS_FILE": "/etc/han/jwks.json"})
	}
	// The default id is the host name (each other byte a '-') and a suffix.
	if c := accepted(t, nil); !regexp.MustCompile(`^[A-Za-z0-9._-]+-[0-9a-f]{6}$`).MatchString(c.InstanceID) {
		t.Errorf("default HAN_INSTANCE_ID %q is no name", c.InstanceID)
	}
}

// One user's handshake bucket: 0.001 to 1000 a second, a burst of at most
// a million. A huge burst or a tiny rate overflowed the bucket's period
// and every handshake of every user was refused with 1013.
func TestUserHandshakeBucketBounds(t *testing.T) {
	for _, v := range []string{"1e-9", "0.0009", "1001"} {
		refused(t, "HAN_WS_USER_HANDSHAKE_RATE", map[string]string{"HAN_WS_USER_HANDSHAKE_RATE": v})
	}
	for _, v := range []string{"10000000000", "1000001"} {
		refused(t, "HAN_WS_USER_HANDSHAKE_BURST", map[string]string{"HAN_WS_USER_HANDSHAKE_BURST": v})
	}
	c := accepted(t, map[string]string{"HAN_WS_USER_HANDSHAKE_RATE": "0.001", "HAN_WS_USER_HANDSHAKE_BURST": "1000000"})
	if c.WSUserHandshakeRate != 0.001 || c.WSUserHandshakeBurst != 1000000 {
		t.Errorf("rate %v burst %d", c.WSUserHandshakeRate, c.WSUserHandshakeBurst)
	}
}

// One user's recovery reads on an instance: HAN_WS_RECOVER_READ_RATE (2 a
// second, 0.001 to 1000; NaN and Inf refused) and
// HAN_WS_RECOVER_READ_BURST (200, 1 to 1,000,000). Each refusal names the
// variable and its range.
func TestRecoverReadBudget(t *testing.T) {
	if c := accepted(t, nil); c.WSRecoverReadRate != 2 || c.WSRecoverReadBurst != 200 {
		t.Errorf("defaults: rate %v burst %d", c.WSRecoverReadRate, c.WSRecoverReadBurst)
	}
	for _, v := range []string{"0", "-1", "1e-9", "0.0009", "1000.5", "NaN", "Inf", "fast"} {
		msg := refused(t, "HAN_WS_RECOVER_READ_RATE", map[string]string{"HAN_WS_RECOVER_READ_RATE": v})
		if !strings.Contains(msg, "HAN_WS_RECOVER_READ_RATE: must be a number of reads a second from 0.001 to 1000") {
			t.Errorf("rate %q: %s", v, msg)
		}
	}
	for _, v := range []string{"0", "-3", "2.5", "1000001", "10000000000", "many"} {
		msg := refused(t, "HAN_WS_RECOVER_READ_BURST", map[string]string{"HAN_WS_RECOVER_READ_BURST": v})
		if !strings.Contains(msg, "HAN_WS_RECOVER_READ_BURST: must be a number from 1 to 1000000") {
			t.Errorf("burst %q: %s", v, msg)
		}
	}
	for _, b := range []struct {
		rate, burst string
		r           float64
		n           int
	}{{"0.001", "1", 0.001, 1}, {"1000", "1000000", 1000, 1000000}, {"0.5", "40", 0.5, 40}} {
		c := accepted(t, map[string]string{"HAN_WS_RECOVER_READ_RATE": b.rate, "HAN_WS_RECOVER_READ_BURST": b.burst})
		if c.WSRecoverReadRate != b.r || c.WSRecoverReadBurst != b.n {
			t.Errorf("%s, %s: rate %v burst %d", b.rate, b.burst, c.WSRecoverReadRate, c.WSRecoverReadBurst)
		}
	}
}

// A lone send waits HAN_SEND_LINGER within its HAN_DB_REQUEST_TIMEOUT: a
// linger above a quarter of the budget is refused (at or above the budget
// every lone send answered 503 database_busy); the default shrinks to a
// quarter of a budget under 20ms.
func TestSendLingerWithinTheDBBudget(t *testing.T) {
	msg := refused(t, "HAN_SEND_LINGER", map[string]string{"HAN_DB_REQUEST_TIMEOUT": "80ms", "HAN_SEND_LINGER": "100ms"})
	if !strings.Contains(msg, "HAN_SEND_LINGER: must be at most a quarter of HAN_DB_REQUEST_TIMEOUT") {
		t.Errorf("refusal: %s", msg)
	}
	refused(t, "HAN_SEND_LINGER", map[string]string{"HAN_DB_REQUEST_TIMEOUT": "80ms", "HAN_SEND_LINGER": "21ms"})
	if c := accepted(t, map[string]string{"HAN_DB_REQUEST_TIMEOUT": "80ms", "HAN_SEND_LINGER": "20ms"}); c.SendLinger != 20*time.Millisecond {
		t.Errorf("linger %v, want 20ms", c.SendLinger)
	}
	if c := accepted(t, map[string]string{"HAN_DB_REQUEST_TIMEOUT": "1ms"}); c.SendLinger != 250*time.Microsecond {
		t.Errorf("default linger with a 1ms budget: %v, want 250µs", c.SendLinger)
	}
	if c := accepted(t, nil); c.SendLinger != 5*time.Millisecond {
		t.Errorf("default linger: %v, want 5ms", c.SendLinger)
	}
}

// The presence loops' and the settings refresh's intervals, and the
// liveness TTL, are at most a day: from about 284,700 h on the loops'
// jitter wrapped negative and they ran back to back against Redis.
func TestLoopBounds(t *testing.T) {
	for name, v := range map[string]string{"HAN_PRESENCE_SWEEP_INTERVAL": "300000h", "HAN_INSTANCE_LIVENESS_TTL": "900000h",
		"HAN_SETTINGS_REFRESH_INTERVAL": "25h"} {
		refused(t, name, map[string]string{name: v})
		refused(t, name, map[string]string{name: "24h1ms"})
		accepted(t, map[string]string{name: "24h"})
	}
}

// HAN_HTTP_BODY_TIMEOUT is at most an hour: the transfer allowance of the
// bytes is added to it, and with the longest duration the sum wrapped.
func TestBodyTimeoutBound(t *testing.T) {
	for _, v := range []string{"2562047h47m16s", "61m"} {
		refused(t, "HAN_HTTP_BODY_TIMEOUT", map[string]string{"HAN_HTTP_BODY_TIMEOUT": v})
	}
	if c := accepted(t, map[string]string{"HAN_HTTP_BODY_TIMEOUT": "1h"}); c.HTTPBodyTimeout != time.Hour {
		t.Errorf("HAN_HTTP_BODY_TIMEOUT=1h: %v", c.HTTPBodyTimeout)
	}
}

// A password with a '/', '?' or '#' written without percent-encoding ends
// the URL's host early: postgres://han:4/secret@host/db reads as host han,
// port 4 and a path holding the rest of the password, which a connection
// error then printed as the database name. Such a URL is refused, naming
// the variable and nothing of its value; the percent-encoded form is taken.
func TestUnencodedPasswordIsRefused(t *testing.T) {
	const tail = "Zq9SecretTail"
	for name, bad := range map[string]string{
		"DATABASE_URL":            "postgres://han:4/" + tail + "@127.0.0.1:5432/db",
		"HAN_DATABASE_DIRECT_URL": "postgresql://han:4?" + tail + "@127.0.0.1:5432/db",
		"REDIS_URL":               "redis://api_backend:6/" + tail + "@127.0.0.1:6379/0",
		"REDIS_REALTIME_URL":      "rediss://api_backend:6#" + tail + "@127.0.0.1:6379/1",
	} {
		if msg := refused(t, name, map[string]string{name: bad}); strings.Contains(msg, tail) || strings.Contains(msg, "han:4") {
			t.Errorf("%s: the refusal quotes the URL: %s", name, msg)
		}
	}
	accepted(t, map[string]string{"DATABASE_URL": "postgres://han:4%2F" + tail + "@127.0.0.1:5432/db",
		"REDIS_URL": "redis://api_backend:6%2F" + tail + "@127.0.0.1:6379/0", "HAN_DATABASE_DIRECT_URL": "postgres://han:pw@127.0.0.1/db?application_name=a@b"})
}

// A wait for company is spent from the budget of the work it delays, before
// that work starts: HAN_IDEMPOTENCY_LINGER from the idempotency script's
// HAN_REDIS_TIMEOUT, HAN_WS_LINGER from the presence pipeline's
// HAN_REDIS_TIMEOUT and the realtime reads' HAN_DB_REQUEST_TIMEOUT. With a
// linger at or above its budget every lone keyed write answered 503 (every
// lone first-sight user record, subscribe check or dialog read failed): a
// linger above a quarter of a budget is refused, naming the budget, and
// the defaults shrink to a quarter of a small one.
func TestLingersWithinTheirBudgets(t *testing.T) {
	for _, c := range []struct {
		name, linger, budget, budgetName string
	}{
		{"HAN_IDEMPOTENCY_LINGER", "100ms", "90ms", "HAN_REDIS_TIMEOUT"},
		{"HAN_IDEMPOTENCY_LINGER", "26ms", "100ms", "HAN_REDIS_TIMEOUT"},
		{"HAN_WS_LINGER", "100ms", "90ms", "HAN_REDIS_TIMEOUT"},
		{"HAN_WS_LINGER", "26ms", "100ms", "HAN_REDIS_TIMEOUT"},
		{"HAN_WS_LINGER", "100ms", "90ms", "HAN_DB_REQUEST_TIMEOUT"},
		{"HAN_WS_LINGER", "26ms", "100ms", "HAN_DB_REQUEST_TIMEOUT"},
	} {
		msg := refused(t, c.name, map[string]string{c.name: c.linger, c.budgetName: c.budget})
		if want := c.name + ": must be at most a quarter of " + c.budgetName; !strings.Contains(msg, want) {
			t.Errorf("%s=%s %s=%s: %s, want %q", c.name, c.linger, c.budgetName, c.budget, msg, want)
		}
	}
	c := accepted(t, map[string]string{"HAN_REDIS_TIMEOUT": "100ms", "HAN_DB_REQUEST_TIMEOUT": "100ms",
		"HAN_IDEMPOTENCY_LINGER": "25ms", "HAN_WS_LINGER": "25ms"})
	if c.IdempotencyLinger != 25*time.Millisecond || c.WSLinger != 25*time.Millisecond {
		t.Errorf("at a quarter of their budgets: idempotency %v, ws %v", c.IdempotencyLinger, c.WSLinger)
	}
	c = accepted(t, map[string]string{"HAN_REDIS_TIMEOUT": "4ms", "HAN_DB_REQUEST_TIMEOUT": "8ms"})
	if c.IdempotencyLinger != time.Millisecond || c.WSLinger != time.Millisecond {
		t.Errorf("defaults with a 4ms Redis budget: idempotency %v, ws %v; want 1ms", c.IdempotencyLinger, c.WSLinger)
	}
	if c = accepted(t, map[string]string{"HAN_DB_REQUEST_TIMEOUT": "8ms"}); c.WSLinger != 2*time.Millisecond || c.IdempotencyLinger != 2*time.Millisecond {
		t.Errorf("defaults with an 8ms PostgreSQL budget: ws %v, idempotency %v; want 2ms", c.WSLinger, c.IdempotencyLinger)
	}
	if c = accepted(t, nil); c.IdempotencyLinger != 2*time.Millisecond || c.WSLinger != 5*time.Millisecond {
		t.Errorf("defaults: idempotency %v, ws %v", c.IdempotencyLinger, c.WSLinger)
	}
}

// Each duration and count has a largest value, so a typo (an extra zero,
// a unit of h for s) or the largest duration is refused at start-up naming
// the variable instead of holding requests, records or sockets for weeks,
// or wrapping in the service's arithmetic; the largest value itself starts.
func TestUpperBounds(t *testing.T) {
	for _, c := range []struct {
		name    string
		refused []string
		largest string
		with    map[string]string // what the largest value needs of other settings
	}{
		// The liveness marker must outlast 1.5 × the Redis budget.
		{"HAN_REDIS_TIMEOUT", []string{"10001ms", "2562047h", "999us"}, "10s", map[string]string{"HAN_INSTANCE_LIVENESS_TTL": "16s"}},
		{"HAN_SHUTDOWN_TIMEOUT", []string{"1h1s", "2562047h"}, "1h", nil},
		{"HAN_DRAIN_DELAY", []string{"10m1s", "2562047h"}, "10m", nil},
		{"HAN_OUTBOX_RETENTION", []string{"168h1s", "2562047h"}, "168h", nil},
		{"HAN_OUTBOX_GRACE", []string{"10m1s", "2562047h"}, "10m", map[string]string{"HAN_OUTBOX_RETENTION": "10m1s"}},
		{"HAN_IDEMPOTENCY_TTL", []string{"168h1s", "2562047h"}, "168h", nil},
		{"HAN_ATTACHMENT_UNSENT_TTL", []string{"720h1s", "2562047h"}, "720h", nil},
		{"HAN_WS_HANDSHAKE_WAIT", []string{"61s", "2562047h"}, "1m", nil},
		{"HAN_HTTP_IDLE_TIMEOUT", []string{"1h1s", "2562047h"}, "1h", nil},
		// The recovery reads one event more: the largest int wrapped.
		{"HAN_WS_RECOVER_MAX", []string{"10001", "9223372036854775807"}, "10000", nil},
	} {
		vars := maps.Clone(c.with)
		if vars == nil {
			vars = map[string]string{}
		}
		for _, v := range c.refused {
			vars[c.name] = v
			refused(t, c.name, vars)
		}
		vars[c.name] = c.largest
		accepted(t, vars)
	}
}

// The relay publishes a row the request path did not after
// HAN_OUTBOX_GRACE, and the purge counts undelivered rows older than
// HAN_OUTBOX_RETENTION as stuck: a grace at or above the retention would
// report every row the relay is still waiting for as stuck.
func TestOutboxGraceBelowRetention(t *testing.T) {
	for _, v := range []map[string]string{{"HAN_OUTBOX_GRACE": "5m", "HAN_OUTBOX_RETENTION": "5m", "HAN_WS_RECOVER_WINDOW": "5m"},
		{"HAN_OUTBOX_GRACE": "6m", "HAN_OUTBOX_RETENTION": "5m", "HAN_WS_RECOVER_WINDOW": "5m"}} {
		if msg := refused(t, "HAN_OUTBOX_GRACE", v); !strings.Contains(msg, "HAN_OUTBOX_GRACE: must be less than HAN_OUTBOX_RETENTION") {
			t.Errorf("%v: %s", v, msg)
		}
	}
	accepted(t, map[string]string{"HAN_OUTBOX_GRACE": "4m59s", "HAN_OUTBOX_RETENTION": "5m", "HAN_WS_RECOVER_WINDOW": "5m"})
}

// Each client address's budget of refused credentials: a burst of 20 and 1
// a second by default; a burst of 1 to a million, a rate of 0.001 to 1000
// a second (NaN and Inf refused).
func TestAuthFailBudgetBounds(t *testing.T) {
	if c := accepted(t, nil); c.AuthFailBurst != 20 || c.AuthFailRate != 1 {
		t.Errorf("defaults: burst %d rate %v", c.AuthFailBurst, c.AuthFailRate)
	}
	for _, v := range []string{"0", "-1", "2.5", "1000001", "many"} {
		refused(t, "HAN_AUTH_FAIL_BURST", map[string]string{"HAN_AUTH_FAIL_BURST": v})
	}
	for _, v := range []string{"0", "-1", "0.0009", "1001", "NaN", "Inf", "fast"} {
		refused(t, "HAN_AUTH_FAIL_RATE", map[string]string{"HAN_AUTH_FAIL_RATE": v})
	}
	c := accepted(t, map[string]string{"HAN_AUTH_FAIL_BURST": "1000000", "HAN_AUTH_FAIL_RATE": "0.001"})
	if c.AuthFailBurst != 1000000 || c.AuthFailRate != 0.001 {
		t.Errorf("burst %d rate %v", c.AuthFailBurst, c.AuthFailRate)
	}
	c = accepted(t, map[string]string{"HAN_AUTH_FAIL_BURST": "1", "HAN_AUTH_FAIL_RATE": "1000"})
	if c.AuthFailBurst != 1 || c.AuthFailRate != 1000 {
		t.Errorf("burst %d rate %v", c.AuthFailBurst, c.AuthFailRate)
	}
}
