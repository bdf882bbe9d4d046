package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func base() map[string]string {
	return map[string]string{
		"REDIS_URL":                "redis://api_backend:pw@127.0.0.1:6379/0",
		"REDIS_REALTIME_URL":       "redis://api_backend:pw@127.0.0.1:6379/1",
		"DATABASE_URL":             "postgres://u@127.0.0.1/db",
		"HAN_HMAC_SECRET":          "0123456789abcdef",
		"HAN_JWT_DEV_HS256_SECRET": "0123456789abcdef0123456789abcdef",
	}
}

func TestDefaults(t *testing.T) {
	c, err := Load(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:8080" || c.Env != "dev" || c.RedisTimeout != time.Second || c.InstanceID == "" {
		t.Fatalf("defaults: %+v", c)
	}
	if !SameRedisInstance(c.RedisURL, c.RedisRealtimeURL) {
		t.Fatal("same host:port must count as one instance")
	}
}

// DB0's and DB1's URLs name one server however they spell its address: the
// default port written out or not, the host's case, the loopback's names.
// Counted as two, the ACL denied DB1's SELECT and the realtime half never
// came up.
func TestSameRedisInstanceAsTheClientDials(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"redis://u:p@10.0.0.10/0", "redis://u:p@10.0.0.10:6379/1", true},
		{"redis://u:p@Redis.Example/0", "redis://u:p@redis.example:6379/1", true},
		{"redis://u:p@localhost:6380/0", "redis://u:p@127.0.0.1:6380/1", true},
		{"redis://u:p@[::1]/0", "redis://u:p@localhost/1", true},
		{"redis://u:p@10.0.0.10/0", "redis://u:p@10.0.0.11/1", false},
		{"redis://u:p@redis.internal/0", "redis://u:p@10.0.0.10/1", true}, // the name may be that address
		{"redis://u:p@redis-a.internal/0", "redis://u:p@redis-b.internal/1", true},
		{"unix:///run/redis/redis.sock?db=0", "redis://u:p@10.0.0.10/1", true}, // one server may listen on both
		{"redis://u:p@10.0.0.10:6379/0", "redis://u:p@10.0.0.10:6380/1", false},
	} {
		if got := SameRedisInstance(c.a, c.b); got != c.same {
			t.Errorf("%s and %s: same %v, want %v", c.a, c.b, got, c.same)
		}
	}
}

func TestValidation(t *testing.T) {
	cases := []struct {
		name, key, value, want string
	}{
		{"prod refuses dev secret", "HAN_ENV", "prod", "HAN_JWT_DEV_HS256_SECRET: refused"},
		{"short dev secret", "HAN_JWT_DEV_HS256_SECRET", "Zq9marker-short", "at least 32 bytes"},
		{"bad redis scheme", "REDIS_URL", "http://x:Zq9marker@h/0", "REDIS_URL: must be a redis://"},
		{"missing realtime", "REDIS_REALTIME_URL", "", "REDIS_REALTIME_URL: required"},
		{"short hmac", "HAN_HMAC_SECRET", "Zq9marker", "HAN_HMAC_SECRET"},
		{"bad origin", "HAN_ALLOWED_ORIGINS", "chat.example.com", "HAN_ALLOWED_ORIGINS"},
		{"bad cors origin", "HAN_CORS_ORIGINS", "https://a.example, Zq9marker.example", "HAN_CORS_ORIGINS: each entry"},
		{"cors origin with path", "HAN_CORS_ORIGINS", "https://Zq9marker.example/app", "HAN_CORS_ORIGINS: each entry"},
		{"bad timeout", "HAN_REDIS_TIMEOUT", "-1s", "HAN_REDIS_TIMEOUT"},
		{"instance with brace", "HAN_INSTANCE_ID", "a{b}", "HAN_INSTANCE_ID"},
		{"log level", "HAN_LOG_LEVEL", "loud", "HAN_LOG_LEVEL"},
		{"body timeout", "HAN_HTTP_BODY_TIMEOUT", "0s", "HAN_HTTP_BODY_TIMEOUT"},
		{"idle timeout", "HAN_HTTP_IDLE_TIMEOUT", "soon", "HAN_HTTP_IDLE_TIMEOUT"},
		{"connection cap", "HAN_MAX_CONNECTIONS", "0", "HAN_MAX_CONNECTIONS: must be a positive number"},
		{"per-ip cap", "HAN_MAX_CONNS_PER_IP", "Zq9marker", "HAN_MAX_CONNS_PER_IP: must be a positive number"},
		{"trusted proxies", "HAN_TRUSTED_PROXIES", "10.0.0.0/8, Zq9marker", "HAN_TRUSTED_PROXIES: each entry"},
		{"forwarded header", "HAN_FORWARDED_HEADER", "x-real-ip", "HAN_FORWARDED_HEADER: must be x-forwarded-for or forwarded"},
		{"realtime url scheme", "HAN_PUBLIC_REALTIME_URL", "http://Zq9marker.example/v1/realtime", "HAN_PUBLIC_REALTIME_URL: must be a ws://"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := base()
			m[c.key] = c.value
			_, err := Load(env(m))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want error containing %q, got %v", c.want, err)
			}
			if strings.Contains(err.Error(), "Zq9marker") {
				t.Fatalf("error echoes a value: %v", err)
			}
		})
	}
	m := base()
	delete(m, "HAN_JWT_DEV_HS256_SECRET")
	if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_JWKS_URL") {
		t.Fatalf("no key source: %v", err)
	}
	m = base()
	m["HAN_ALLOWED_ORIGINS"] = "https://a.example, http://localhost:8080/"
	c, err := Load(env(m))
	if err != nil || len(c.AllowedOrigins) != 2 || c.AllowedOrigins[1] != "http://localhost:8080" {
		t.Fatalf("origins: %v %v", c.AllowedOrigins, err)
	}
	if len(c.CORSOrigins) != 0 {
		t.Fatalf("CORS origins without HAN_CORS_ORIGINS: %v", c.CORSOrigins)
	}
	// The REST and WebSocket lists are independent.
	m["HAN_CORS_ORIGINS"] = "https://app.example/ ,http://localhost:5173"
	c, err = Load(env(m))
	if err != nil || !slices.Equal(c.CORSOrigins, []string{"https://app.example", "http://localhost:5173"}) || len(c.AllowedOrigins) != 2 {
		t.Fatalf("CORS origins: %v %v", c.CORSOrigins, err)
	}
	// Browsers send Origin in lower case without the scheme's default port;
	// an entry written otherwise is kept as the browser sends it, or it
	// would match no page.
	m["HAN_CORS_ORIGINS"] = "HTTPS://Chat.Example:443/, http://LOCALHOST:80, http://[::1]:80, https://a.example:8443, http://b.example:443"
	m["HAN_ALLOWED_ORIGINS"] = "https://Chat.Example:443"
	c, err = Load(env(m))
	want := []string{"https://chat.example", "http://localhost", "http://[::1]", "https://a.example:8443", "http://b.example:443"}
	if err != nil || !slices.Equal(c.CORSOrigins, want) || !slices.Equal(c.AllowedOrigins, want[:1]) {
		t.Fatalf("origins as browsers send them: CORS %v, WebSocket %v, %v", c.CORSOrigins, c.AllowedOrigins, err)
	}
}

// Browsers send an internationalized host name in Origin in its ASCII
// (punycode) form, so an entry written in Unicode would match no page:
// start-up refuses it, naming the variable and the entry; the punycode
// form is accepted.
func TestOriginsWithAHostNameThatIsNotASCIIAreRefused(t *testing.T) {
	for _, name := range []string{"HAN_CORS_ORIGINS", "HAN_ALLOWED_ORIGINS"} {
		for _, entry := range []string{"https://bücher.example", "https://B%C3%BCcher.example", "https://чат.example:8443"} {
			m := base()
			m[name] = "https://app.example, " + entry
			_, err := Load(env(m))
			if err == nil || !strings.Contains(err.Error(), name+": ") || !strings.Contains(err.Error(), entry) ||
				!strings.Contains(err.Error(), "punycode") {
				t.Errorf("%s=%q: %v, want a refusal naming the variable, the entry and its punycode form", name, entry, err)
			}
		}
		m := base()
		m[name] = "https://xn--bcher-kva.example"
		c, err := Load(env(m))
		got := c.CORSOrigins
		if name == "HAN_ALLOWED_ORIGINS" {
			got = c.AllowedOrigins
		}
		if err != nil || !slices.Equal(got, []string{"https://xn--bcher-kva.example"}) {
			t.Errorf("%s in punycode: %v %v", name, got, err)
		}
	}
}

func TestWSMaxConnsPerUser(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.WSMaxConnsPerUser != 16 {
		t.Fatalf("default: %d %v", c.WSMaxConnsPerUser, err)
	}
	m["HAN_WS_MAX_CONNS_PER_USER"] = "3"
	if c, err := Load(env(m)); err != nil || c.WSMaxConnsPerUser != 3 {
		t.Fatalf("set: %d %v", c.WSMaxConnsPerUser, err)
	}
	for _, v := range []string{"0", "-1", "many"} {
		m["HAN_WS_MAX_CONNS_PER_USER"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_MAX_CONNS_PER_USER: must be a positive number") {
			t.Fatalf("%q: %v", v, err)
		}
	}
}

// HAN_SEND_DIALOG_QUEUE bounds the sends one instance holds per dialog:
// 256 by default, a positive number when set.
func TestSendDialogQueue(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.SendDialogQueue != 256 {
		t.Fatalf("default: %d %v", c.SendDialogQueue, err)
	}
	m["HAN_SEND_DIALOG_QUEUE"] = "8"
	if c, err := Load(env(m)); err != nil || c.SendDialogQueue != 8 {
		t.Fatalf("set: %d %v", c.SendDialogQueue, err)
	}
	for _, v := range []string{"0", "-2", "lots"} {
		m["HAN_SEND_DIALOG_QUEUE"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_SEND_DIALOG_QUEUE: must be a positive number") {
			t.Fatalf("%q: %v", v, err)
		}
	}
}

func TestHTTPEdgeSettings(t *testing.T) {
	c, err := Load(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPBodyTimeout != 15*time.Second || c.HTTPIdleTimeout != 120*time.Second || c.MaxConnections != 0 ||
		c.MaxConnsPerIP != 0 || len(c.TrustedProxies) != 0 {
		t.Fatalf("edge defaults: %+v", c)
	}
	m := base()
	m["HAN_TRUSTED_PROXIES"] = "10.0.0.0/8, 192.0.2.7 ,2001:db8::/32,::ffff:198.51.100.0/120"
	m["HAN_MAX_CONNECTIONS"], m["HAN_MAX_CONNS_PER_IP"] = "500", "20"
	if c, err = Load(env(m)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.TrustedProxies {
		got = append(got, p.String())
	}
	if strings.Join(got, " ") != "10.0.0.0/8 192.0.2.7/32 2001:db8::/32 198.51.100.0/24" || c.MaxConnections != 500 || c.MaxConnsPerIP != 20 {
		t.Fatalf("parsed: %v %d %d", got, c.MaxConnections, c.MaxConnsPerIP)
	}

	m = base()
	delete(m, "HAN_JWT_DEV_HS256_SECRET")
	m["HAN_JWKS_FILE"], m["HAN_ENV"] = "/etc/han/jwks.json", "prod"
	if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_PUBLIC_REALTIME_URL: required when HAN_ENV=prod") {
		t.Fatalf("prod without a public realtime URL: %v", err)
	}
	m["HAN_PUBLIC_REALTIME_URL"] = "wss://chat.example.com/v1/realtime"
	if _, err := Load(env(m)); err != nil {
		t.Fatalf("prod with a public realtime URL: %v", err)
	}
}

func TestDBRequestTimeout(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.DBRequestTimeout != 2*time.Second {
		t.Fatalf("default: %v %v", c.DBRequestTimeout, err)
	}
	m["HAN_DB_REQUEST_TIMEOUT"] = "500ms"
	if c, err := Load(env(m)); err != nil || c.DBRequestTimeout != 500*time.Millisecond {
		t.Fatalf("set: %v %v", c.DBRequestTimeout, err)
	}
	for _, v := range []string{"0", "-1s", "500us", "soon", "61m", "600h"} {
		m["HAN_DB_REQUEST_TIMEOUT"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_DB_REQUEST_TIMEOUT") {
			t.Fatalf("%q: %v", v, err)
		}
	}
}

// The drain delay defaults to 5s so load balancers see /readyz 503 before
// the listener closes; 0 turns it off (tests, a stack without a balancer).
func TestDrainDelay(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 5 * time.Second, "0": 0, "2s": 2 * time.Second} {
		m := base()
		m["HAN_DRAIN_DELAY"] = v
		c, err := Load(env(m))
		if err != nil || c.DrainDelay != want {
			t.Errorf("HAN_DRAIN_DELAY=%q: %v %v, want %v", v, c.DrainDelay, err, want)
		}
	}
	for _, v := range []string{"-1s", "soon"} {
		m := base()
		m["HAN_DRAIN_DELAY"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_DRAIN_DELAY") {
			t.Errorf("HAN_DRAIN_DELAY=%q: %v", v, err)
		}
	}
}

// Behind PgBouncer: the exec mode is one of the four pgx modes that work
// with a single round trip per statement or a direct connection, and
// migrations go to HAN_DATABASE_DIRECT_URL, which defaults to DATABASE_URL.
func TestDatabaseDirectURLAndExecMode(t *testing.T) {
	c, err := Load(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseDirectURL != c.DatabaseURL || c.DBExecMode != "" {
		t.Fatalf("defaults: direct %q, mode %q", c.DatabaseDirectURL, c.DBExecMode)
	}
	m := base()
	m["DATABASE_URL"] = "postgres://u@127.0.0.1:6432/db"
	m["HAN_DATABASE_DIRECT_URL"] = "postgres://u@127.0.0.1:5432/db"
	m["HAN_DB_EXEC_MODE"] = "simple_protocol"
	if c, err = Load(env(m)); err != nil || c.DatabaseDirectURL != m["HAN_DATABASE_DIRECT_URL"] || c.DBExecMode != "simple_protocol" {
		t.Fatalf("set: %+v %v", c, err)
	}
	for key, value := range map[string]string{
		"HAN_DB_EXEC_MODE":        "describe_exec",
		"HAN_DATABASE_DIRECT_URL": "mysql://Zq9marker@h/db",
	} {
		m := base()
		m[key] = value
		_, err := Load(env(m))
		if err == nil || !strings.Contains(err.Error(), key+":") || strings.Contains(err.Error(), "Zq9marker") {
			t.Fatalf("%s=%s: %v", key, value, err)
		}
	}
}

// HAN_PUBSUB_MODE is auto unless set to sharded or classic; anything else
// stops the start-up with an error naming the variable.
func TestPubSubMode(t *testing.T) {
	c, err := Load(env(base()))
	if err != nil || c.PubSubMode != "auto" {
		t.Fatalf("default: %q %v", c.PubSubMode, err)
	}
	for _, mode := range []string{"auto", "sharded", "classic"} {
		m := base()
		m["HAN_PUBSUB_MODE"] = mode
		if c, err := Load(env(m)); err != nil || c.PubSubMode != mode {
			t.Fatalf("%s: %q %v", mode, c.PubSubMode, err)
		}
	}
	for _, mode := range []string{"Sharded", "spublish", " classic"} {
		m := base()
		m["HAN_PUBSUB_MODE"] = mode
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_PUBSUB_MODE: must be auto, sharded or classic") {
			t.Fatalf("%q: %v", mode, err)
		}
	}
}

// The outbox grace stays far above the 50 ms in which the request path's
// published rows are marked delivered, so the relay does not publish them
// again; the retention of delivered rows defaults to 15m.
func TestOutboxGraceAndRetention(t *testing.T) {
	m := base()
	c, err := Load(env(m))
	if err != nil || c.OutboxGrace != 5*time.Second || c.OutboxRetention != 15*time.Minute {
		t.Fatalf("defaults: grace %v retention %v %v", c.OutboxGrace, c.OutboxRetention, err)
	}
	m["HAN_OUTBOX_GRACE"], m["HAN_OUTBOX_RETENTION"] = "1s", "2h"
	if c, err := Load(env(m)); err != nil || c.OutboxGrace != time.Second || c.OutboxRetention != 2*time.Hour {
		t.Fatalf("set: grace %v retention %v %v", c.OutboxGrace, c.OutboxRetention, err)
	}
	for _, v := range []string{"999ms", "50ms", "0", "soon"} {
		m := base()
		m["HAN_OUTBOX_GRACE"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_OUTBOX_GRACE") {
			t.Errorf("HAN_OUTBOX_GRACE=%q: %v", v, err)
		}
	}
	for _, v := range []string{"0", "-1m", "soon"} {
		m := base()
		m["HAN_OUTBOX_RETENTION"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_OUTBOX_RETENTION") {
			t.Errorf("HAN_OUTBOX_RETENTION=%q: %v", v, err)
		}
	}
}

// HAN_WS_RECOVER_WINDOW (10m, or a shorter HAN_OUTBOX_RETENTION) and
// HAN_WS_RECOVER_MAX (100) bound the replay of a subscribe with sinceSeq;
// the window may not outlast the outbox rows it replays from
// (HAN_OUTBOX_RETENTION).
func TestWSRecover(t *testing.T) {
	m := base()
	c, err := Load(env(m))
	if err != nil || c.WSRecoverWindow != 10*time.Minute || c.WSRecoverMax != 100 {
		t.Fatalf("defaults: window %v max %d %v", c.WSRecoverWindow, c.WSRecoverMax, err)
	}
	m["HAN_WS_RECOVER_WINDOW"], m["HAN_WS_RECOVER_MAX"], m["HAN_OUTBOX_RETENTION"] = "15m", "7", "15m"
	if c, err := Load(env(m)); err != nil || c.WSRecoverWindow != 15*time.Minute || c.WSRecoverMax != 7 {
		t.Fatalf("set: window %v max %d %v", c.WSRecoverWindow, c.WSRecoverMax, err)
	}
	// Unset, the window shrinks to a shorter retention instead of refusing
	// the retention alone.
	m = base()
	m["HAN_OUTBOX_RETENTION"] = "5m"
	if c, err := Load(env(m)); err != nil || c.WSRecoverWindow != 5*time.Minute {
		t.Fatalf("HAN_OUTBOX_RETENTION=5m alone: window %v %v, want 5m", c.WSRecoverWindow, err)
	}
	for _, tc := range []struct{ window, retention string }{{"16m", "15m"}, {"6m", "5m"}, {"0", ""}, {"soon", ""}} {
		m := base()
		m["HAN_WS_RECOVER_WINDOW"], m["HAN_OUTBOX_RETENTION"] = tc.window, tc.retention
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_RECOVER_WINDOW") {
			t.Errorf("window %q retention %q: %v", tc.window, tc.retention, err)
		}
	}
	for _, v := range []string{"0", "-1", "many"} {
		m := base()
		m["HAN_WS_RECOVER_MAX"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_RECOVER_MAX: must be a positive number") {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// HAN_WS_PRESENCE_DELAY: 1s by default, 0 writes presence frames at once,
// nothing negative or over 1s.
func TestWSPresenceDelay(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.WSPresenceDelay != time.Second {
		t.Fatalf("default %v %v", c.WSPresenceDelay, err)
	}
	for v, want := range map[string]time.Duration{"0": 0, "0s": 0, "250ms": 250 * time.Millisecond, "1s": time.Second} {
		m["HAN_WS_PRESENCE_DELAY"] = v
		if c, err := Load(env(m)); err != nil || c.WSPresenceDelay != want {
			t.Errorf("%q: %v %v, want %v", v, c.WSPresenceDelay, err, want)
		}
	}
	for _, v := range []string{"-1s", "1001ms", "soon", "5"} {
		m["HAN_WS_PRESENCE_DELAY"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_PRESENCE_DELAY: must be a duration from 0 to 1s") {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// Handshake admission: HAN_WS_HANDSHAKE_CONCURRENCY (unset: sized from the
// pools by the service), HAN_WS_HANDSHAKE_QUEUE (16384) and
// HAN_WS_HANDSHAKE_WAIT (6s); numbers must be positive.
func TestWSHandshakeAdmission(t *testing.T) {
	m := base()
	c, err := Load(env(m))
	if err != nil || c.WSHandshakeConcurrency != 0 || c.WSHandshakeQueue != 16384 || c.WSHandshakeWait != 6*time.Second {
		t.Fatalf("defaults: concurrency %d queue %d wait %v %v", c.WSHandshakeConcurrency, c.WSHandshakeQueue, c.WSHandshakeWait, err)
	}
	m["HAN_WS_HANDSHAKE_CONCURRENCY"], m["HAN_WS_HANDSHAKE_QUEUE"], m["HAN_WS_HANDSHAKE_WAIT"] = "50", "900", "1500ms"
	if c, err := Load(env(m)); err != nil || c.WSHandshakeConcurrency != 50 || c.WSHandshakeQueue != 900 || c.WSHandshakeWait != 1500*time.Millisecond {
		t.Fatalf("set: concurrency %d queue %d wait %v %v", c.WSHandshakeConcurrency, c.WSHandshakeQueue, c.WSHandshakeWait, err)
	}
	for _, name := range []string{"HAN_WS_HANDSHAKE_CONCURRENCY", "HAN_WS_HANDSHAKE_QUEUE"} {
		for _, v := range []string{"0", "-1", "many"} {
			m := base()
			m[name] = v
			if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), name+": must be a positive number") {
				t.Errorf("%s=%q: %v", name, v, err)
			}
		}
	}
	for _, v := range []string{"0", "soon"} {
		m := base()
		m["HAN_WS_HANDSHAKE_WAIT"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_HANDSHAKE_WAIT") {
			t.Errorf("wait %q: %v", v, err)
		}
	}
}

// One user's handshakes: HAN_WS_USER_HANDSHAKE_RATE (1 a second, above 0 up
// to 1000; NaN and Inf refused) and HAN_WS_USER_HANDSHAKE_BURST (32,
// positive).
func TestWSUserHandshakeRate(t *testing.T) {
	m := base()
	c, err := Load(env(m))
	if err != nil || c.WSUserHandshakeRate != 1 || c.WSUserHandshakeBurst != 32 {
		t.Fatalf("defaults: rate %v burst %d %v", c.WSUserHandshakeRate, c.WSUserHandshakeBurst, err)
	}
	m["HAN_WS_USER_HANDSHAKE_RATE"], m["HAN_WS_USER_HANDSHAKE_BURST"] = "0.5", "8"
	if c, err := Load(env(m)); err != nil || c.WSUserHandshakeRate != 0.5 || c.WSUserHandshakeBurst != 8 {
		t.Fatalf("set: rate %v burst %d %v", c.WSUserHandshakeRate, c.WSUserHandshakeBurst, err)
	}
	for _, v := range []string{"0", "-1", "NaN", "Inf", "1001", "fast"} {
		m := base()
		m["HAN_WS_USER_HANDSHAKE_RATE"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_USER_HANDSHAKE_RATE") {
			t.Errorf("rate %q: %v", v, err)
		}
	}
	for _, v := range []string{"0", "-3", "2.5"} {
		m := base()
		m["HAN_WS_USER_HANDSHAKE_BURST"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_USER_HANDSHAKE_BURST") {
			t.Errorf("burst %q: %v", v, err)
		}
	}
}

// The waits for company: HAN_SEND_LINGER (5ms), HAN_IDEMPOTENCY_LINGER
// (2ms) and HAN_WS_LINGER (5ms), each 0 (off) to 100ms.
func TestLingers(t *testing.T) {
	m := base()
	c, err := Load(env(m))
	if err != nil || c.SendLinger != 5*time.Millisecond || c.IdempotencyLinger != 2*time.Millisecond || c.WSLinger != 5*time.Millisecond {
		t.Fatalf("defaults: %v %v %v %v", c.SendLinger, c.IdempotencyLinger, c.WSLinger, err)
	}
	get := map[string]func(Config) time.Duration{
		"HAN_SEND_LINGER":        func(c Config) time.Duration { return c.SendLinger },
		"HAN_IDEMPOTENCY_LINGER": func(c Config) time.Duration { return c.IdempotencyLinger },
		"HAN_WS_LINGER":          func(c Config) time.Duration { return c.WSLinger },
	}
	for name, of := range get {
		m := base()
		for v, want := range map[string]time.Duration{"0": 0, "0s": 0, "1ms": time.Millisecond, "100ms": 100 * time.Millisecond} {
			m[name] = v
			if c, err := Load(env(m)); err != nil || of(c) != want {
				t.Errorf("%s=%q: %v %v, want %v", name, v, of(c), err, want)
			}
		}
		for _, v := range []string{"-1ms", "101ms", "1s", "soon", "5"} {
			m[name] = v
			if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), name+": must be a duration from 0 to 100ms") {
				t.Errorf("%s=%q: %v", name, v, err)
			}
		}
	}
}

// HAN_ATTACHMENT_UNSENT_TTL (24h) is how long an uploaded attachment no
// message links is kept; under an hour it could go while its message is
// still being written, so such values are refused.
func TestAttachmentUnsentTTL(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.AttachmentUnsentTTL != 24*time.Hour {
		t.Fatalf("default: %v %v", c.AttachmentUnsentTTL, err)
	}
	m["HAN_ATTACHMENT_UNSENT_TTL"] = "72h"
	if c, err := Load(env(m)); err != nil || c.AttachmentUnsentTTL != 72*time.Hour {
		t.Fatalf("72h: %v %v", c.AttachmentUnsentTTL, err)
	}
	for _, v := range []string{"59m", "0", "-1h", "soon"} {
		m := base()
		m["HAN_ATTACHMENT_UNSENT_TTL"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_ATTACHMENT_UNSENT_TTL") {
			t.Errorf("HAN_ATTACHMENT_UNSENT_TTL=%q: %v", v, err)
		}
	}
}

// The liveness marker is refreshed every third of its TTL, and a refresh
// may take HAN_REDIS_TIMEOUT: a TTL that does not cover both lets the
// marker of a running instance expire, and the other instances then sweep
// its connections out of presence while they are open. A TTL under 1ms is
// no TTL at all for Redis (it counts in milliseconds): the marker was
// never written.
// A Redis timeout so large that three times it overflows a duration is
// refused like any other too large for the TTL; a TTL above a day is
// refused (LoopBounds).
func TestInstanceLivenessTTLCoversARefresh(t *testing.T) {
	for _, tc := range []struct{ ttl, redisTimeout string }{{"500us", ""}, {"1s", ""}, {"1500ms", "1s"}, {"10s", "7s"}, {"", "1000000h"}} {
		m := base()
		m["HAN_INSTANCE_LIVENESS_TTL"], m["HAN_REDIS_TIMEOUT"] = tc.ttl, tc.redisTimeout
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_INSTANCE_LIVENESS_TTL: must be") {
			t.Errorf("HAN_INSTANCE_LIVENESS_TTL=%s HAN_REDIS_TIMEOUT=%q: %v, want a refusal", tc.ttl, tc.redisTimeout, err)
		}
	}
	for _, tc := range []struct{ ttl, redisTimeout string }{{"", ""}, {"2s", ""}, {"1s", "500ms"}, {"10s", "6s"}, {"24h", "1s"}} {
		m := base()
		m["HAN_INSTANCE_LIVENESS_TTL"], m["HAN_REDIS_TIMEOUT"] = tc.ttl, tc.redisTimeout
		if _, err := Load(env(m)); err != nil {
			t.Errorf("HAN_INSTANCE_LIVENESS_TTL=%q HAN_REDIS_TIMEOUT=%q refused: %v", tc.ttl, tc.redisTimeout, err)
		}
	}
}

// "production" (any case) is production like "prod", as the JWT verifier
// reads it: the dev secret is refused and a public realtime URL required.
// Without this, HAN_ENV=production passed the configuration and only the
// verifier refused the dev secret, at start.
func TestProductionIsProd(t *testing.T) {
	for _, name := range []string{"production", "Production", "PROD"} {
		m := base()
		m["HAN_ENV"] = name
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_JWT_DEV_HS256_SECRET: refused when HAN_ENV=prod") ||
			!strings.Contains(err.Error(), "HAN_PUBLIC_REALTIME_URL: required") {
			t.Errorf("HAN_ENV=%s with the dev secret and no public realtime URL: %v", name, err)
		}
	}
}

// The background loops that read Redis or PostgreSQL on every turn refuse
// an interval that would spin (1ns, 1ms); 10ms and more are taken.
func TestLoopIntervalsHaveAFloor(t *testing.T) {
	for _, name := range []string{"HAN_PRESENCE_SWEEP_INTERVAL", "HAN_SETTINGS_REFRESH_INTERVAL"} {
		for _, v := range []string{"1ns", "1ms", "9ms"} {
			m := base()
			m[name] = v
			if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), name+": must be a duration of 10ms to 24h") {
				t.Errorf("%s=%s: %v", name, v, err)
			}
		}
		m := base()
		m[name] = "10ms"
		if _, err := Load(env(m)); err != nil {
			t.Errorf("%s=10ms: %v", name, err)
		}
	}
}
