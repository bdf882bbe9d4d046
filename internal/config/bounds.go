package config

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Bounds of values whose arithmetic in the service would overflow, or
// whose effect is no longer what the name says, beyond them.
const (
	// maxLoopInterval is the longest interval of a background loop
	// (HAN_PRESENCE_SWEEP_INTERVAL, HAN_SETTINGS_REFRESH_INTERVAL) and the
	// longest HAN_INSTANCE_LIVENESS_TTL: a day is "rarely" enough, and the
	// loops' jitter and budgets stay far from a duration's range.
	maxLoopInterval = 24 * time.Hour
	// maxBodyTimeout is the longest HAN_HTTP_BODY_TIMEOUT: the base of the
	// body and response deadlines, to which the transfer allowance of the
	// bytes is added.
	maxBodyTimeout = time.Hour
	// The per-user handshake bucket: at least one token every 1000 s, at
	// most 1000 a second, and at most a million at once (a burst that
	// large already means "no limit").
	minUserHandshakeRate  = 0.001
	maxUserHandshakeRate  = 1000
	maxUserHandshakeBurst = 1_000_000
	// The per-address budget of refused credentials: at least one refusal
	// every 1000 s, at most 1000 a second (signature checks an address may
	// make the instance spend for nothing), and at most a million at once.
	minAuthFailRate  = 0.001
	maxAuthFailRate  = 1000
	maxAuthFailBurst = 1_000_000
	// maxRedisTimeout is the longest HAN_REDIS_TIMEOUT: a Redis that takes
	// longer to answer one command is down, and a request waits up to this
	// for each of its Redis steps. An idempotency lock lives 30 s and is
	// extended every 10 s, each extension within this budget: at most 10 s,
	// an extension lands with 10 s to spare before the lock would expire.
	maxRedisTimeout = 10 * time.Second
	// maxShutdownTimeout is the longest HAN_SHUTDOWN_TIMEOUT and
	// maxDrainDelay the longest HAN_DRAIN_DELAY: longer than any
	// orchestrator's grace period an operator would set, and an instance
	// that takes longer to stop is one that does not stop.
	maxShutdownTimeout = time.Hour
	maxDrainDelay      = 10 * time.Minute
	// maxOutboxGrace is the longest HAN_OUTBOX_GRACE: a message whose
	// publish the request path lost reaches its subscribers only after
	// it, and later than minutes is no realtime delivery.
	maxOutboxGrace = 10 * time.Minute
	// maxOutboxRetention is the longest HAN_OUTBOX_RETENTION, so the
	// longest HAN_WS_RECOVER_WINDOW: the outbox holds every event of that
	// long (about 900,000 rows for 15 minutes at 1,000 messages a second),
	// and a client away longer reconciles over REST anyway.
	maxOutboxRetention = 7 * 24 * time.Hour
	// maxIdempotencyTTL is the longest HAN_IDEMPOTENCY_TTL: every keyed
	// request keeps a record this long in Redis (memory) and PostgreSQL,
	// and clients retry within minutes, not weeks.
	maxIdempotencyTTL = 7 * 24 * time.Hour
	// maxAttachmentUnsentTTL is the longest HAN_ATTACHMENT_UNSENT_TTL: the
	// blob of an upload no message links is kept on disk this long.
	maxAttachmentUnsentTTL = 30 * 24 * time.Hour
	// maxHandshakeWait is the longest HAN_WS_HANDSHAKE_WAIT: a queued
	// handshake holds an accepted socket, and clients give up far sooner
	// (the JavaScript SDK after 15 s).
	maxHandshakeWait = time.Minute
	// maxIdleTimeout is the longest HAN_HTTP_IDLE_TIMEOUT: an idle
	// keep-alive connection holds a descriptor and a place under
	// HAN_MAX_CONNECTIONS and HAN_MAX_CONNS_PER_IP.
	maxIdleTimeout = time.Hour
	// maxRecoverEvents is the largest HAN_WS_RECOVER_MAX: a replay is at
	// most 256 KiB of frames anyway, far fewer than 10,000 events, and the
	// recovery reads one event more than it, which wraps at the largest int.
	maxRecoverEvents = 10_000
	// The per-user bucket of recovery reads: the same range as the
	// handshake bucket's. At least one read every 1000 s; at most 1000 a
	// second, and a million at once, which already mean "no limit" (one
	// user's sockets hold at most HAN_WS_MAX_CONNS_PER_USER × 200
	// subscriptions).
	minRecoverReadRate  = 0.001
	maxRecoverReadRate  = 1000
	maxRecoverReadBurst = 1_000_000
)

// readRecoverReads reads the per-user recovery read budget,
// HAN_WS_RECOVER_READ_RATE and HAN_WS_RECOVER_READ_BURST.
func (c *Config) readRecoverReads(getenv func(string) string, bad func(string, ...any)) {
	var err error
	c.WSRecoverReadRate = 2
	if v := getenv("HAN_WS_RECOVER_READ_RATE"); v != "" {
		// ParseFloat takes NaN and Inf: the range check refuses both.
		if c.WSRecoverReadRate, err = strconv.ParseFloat(v, 64); err != nil ||
			!(c.WSRecoverReadRate >= minRecoverReadRate && c.WSRecoverReadRate <= maxRecoverReadRate) {
			bad("HAN_WS_RECOVER_READ_RATE: must be a number of reads a second from 0.001 to 1000")
		}
	}
	c.WSRecoverReadBurst = 200
	if v := getenv("HAN_WS_RECOVER_READ_BURST"); v != "" {
		if c.WSRecoverReadBurst, err = strconv.Atoi(v); err != nil || c.WSRecoverReadBurst < 1 ||
			c.WSRecoverReadBurst > maxRecoverReadBurst {
			bad("HAN_WS_RECOVER_READ_BURST: must be a number from 1 to 1000000")
		}
	}
}

// readLingers reads the waits for company. Each is spent from the budget
// of the work it delays, before that work starts, so each is at most a
// quarter of every such budget (the rest is the work's own), and its
// default shrinks to that:
//   - HAN_SEND_LINGER: a lone send's HAN_DB_REQUEST_TIMEOUT;
//   - HAN_IDEMPOTENCY_LINGER: a keyed write's idempotency script, whose
//     budget is HAN_REDIS_TIMEOUT (at or above it every lone keyed write
//     answered 503);
//   - HAN_WS_LINGER: the presence pipeline, a Redis round trip
//     (HAN_REDIS_TIMEOUT), and the subscribe checks, dialog reads and
//     user records, each within HAN_DB_REQUEST_TIMEOUT (at or above it
//     every lone one failed as database_busy).
func (c *Config) readLingers(getenv func(string) string, bad func(string, ...any)) {
	redis := budget{"HAN_REDIS_TIMEOUT", c.RedisTimeout}
	db := budget{"HAN_DB_REQUEST_TIMEOUT", c.DBRequestTimeout}
	c.SendLinger = readLinger(getenv, bad, "HAN_SEND_LINGER", 5*time.Millisecond, db)
	c.IdempotencyLinger = readLinger(getenv, bad, "HAN_IDEMPOTENCY_LINGER", 2*time.Millisecond, redis)
	c.WSLinger = readLinger(getenv, bad, "HAN_WS_LINGER", 5*time.Millisecond, redis, db)
}

// budget is a setting a linger is spent from: its variable and value.
type budget struct {
	name string
	d    time.Duration
}

// readLinger reads the linger name (default def, shrunk to a quarter of
// the smallest budget) and refuses one above a quarter of a budget. A
// budget of 0 was refused itself and is not compared.
func readLinger(getenv func(string) string, bad func(string, ...any), name string, def time.Duration, budgets ...budget) time.Duration {
	for _, b := range budgets {
		if b.d > 0 {
			def = min(def, b.d/4)
		}
	}
	d, err := linger(getenv(name), def)
	if err != nil {
		bad("%s: %v", name, err)
		return 0
	}
	for _, b := range budgets {
		if b.d > 0 && d > b.d/4 {
			bad("%s: must be at most a quarter of %s", name, b.name)
			break
		}
	}
	return d
}

// IsName reports whether s is a non-empty name of ASCII letters, digits,
// '.', '_' and '-' only: what HAN_ENV and HAN_INSTANCE_ID may hold. They
// become parts of Redis keys and PostgreSQL scopes, and HAN_ENV switches
// the production guards on: a value with a character outside the set (a
// carriage return from an env file saved with CRLF line ends, a no-break
// space) would read as another name than the one the operator sees.
func IsName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i]) {
			return false
		}
	}
	return true
}

func isNameByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-'
}

// asName turns s into a name IsName takes, each other byte becoming '-'
// (the host name in the default HAN_INSTANCE_ID).
func asName(s string) string {
	b := []byte(s)
	for i := range b {
		if !isNameByte(b[i]) {
			b[i] = '-'
		}
	}
	return string(b)
}

// atAfterHost reports whether u has no user information while an '@'
// follows its host (in the path, the query or the fragment): the sign of a
// password written with a '/', '?' or '#' not percent-encoded, which ends
// the host early. postgres://han:4/secret@db:5432/han reads as host han,
// port 4, and a path holding the rest of the password, which a connection
// error would then print as the database name.
func atAfterHost(u *url.URL) bool {
	return u.User == nil && strings.ContainsRune(u.EscapedPath()+"?"+u.RawQuery+"#"+u.EscapedFragment(), '@')
}

// unencodedPassword is the problem atAfterHost finds, for name.
func unencodedPassword(name string) string {
	return name + ": an '@' follows the host: a password holding '/', '?' or '#' must be percent-encoded (%2F, %3F, %23)"
}

// checkListenAddrs refuses a HAN_HTTP_ADDR or HAN_METRICS_ADDR that is no
// host:port (a space or control character from an env file, no port, a
// port beyond 65535), and a metrics address that would bind the API's port:
// the same port, not 0, on the same host or where either is every address.
// Else start-up failed at the second listen with "address already in use",
// after the migrations, naming neither variable.
func (c *Config) checkListenAddrs(bad func(string, ...any)) {
	httpHost, httpPort, httpOK := listenAddr(c.HTTPAddr)
	if !httpOK {
		bad("HAN_HTTP_ADDR (or -addr): must be host:port like 127.0.0.1:8080 (no spaces)")
	}
	if c.MetricsAddr == "" {
		return
	}
	host, port, ok := listenAddr(c.MetricsAddr)
	switch {
	case !ok:
		bad("HAN_METRICS_ADDR: must be host:port like 127.0.0.1:9090 (no spaces)")
	case httpOK && port != 0 && port == httpPort && (strings.EqualFold(host, httpHost) || anyAddr(host) || anyAddr(httpHost)):
		bad("HAN_METRICS_ADDR: must differ from HAN_HTTP_ADDR (or -addr; another port: /metrics gets a listener of its own)")
	}
}

// listenAddr splits a listen address into its host and port number.
func listenAddr(addr string) (host string, port int, ok bool) {
	for i := 0; i < len(addr); i++ {
		if addr[i] <= ' ' || addr[i] == 0x7f {
			return "", 0, false
		}
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil || p == "" {
		return "", 0, false
	}
	if port, err = net.LookupPort("tcp", p); err != nil {
		return "", 0, false
	}
	return host, port, true
}

// anyAddr reports whether a listen host means every address.
func anyAddr(host string) bool { return host == "" || host == "0.0.0.0" || host == "::" }

// readAuthFail reads each client address's budget of refused credentials
// on the REST API: HAN_AUTH_FAIL_BURST refusals at once (default 20), then
// HAN_AUTH_FAIL_RATE a second (default 1).
func (c *Config) readAuthFail(getenv func(string) string, bad func(string, ...any)) {
	var err error
	c.AuthFailBurst = 20
	if v := getenv("HAN_AUTH_FAIL_BURST"); v != "" {
		if c.AuthFailBurst, err = strconv.Atoi(v); err != nil || c.AuthFailBurst < 1 || c.AuthFailBurst > maxAuthFailBurst {
			bad("HAN_AUTH_FAIL_BURST: must be a number from 1 to 1000000")
		}
	}
	c.AuthFailRate = 1
	if v := getenv("HAN_AUTH_FAIL_RATE"); v != "" {
		// ParseFloat takes NaN and Inf: the range check refuses both.
		if c.AuthFailRate, err = strconv.ParseFloat(v, 64); err != nil ||
			!(c.AuthFailRate >= minAuthFailRate && c.AuthFailRate <= maxAuthFailRate) {
			bad("HAN_AUTH_FAIL_RATE: must be a number of refusals a second from 0.001 to 1000")
		}
	}
}
