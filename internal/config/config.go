// Package config reads the service configuration from environment variables
// (the table in README.md) and validates it. Error messages name the variable and the
// problem, never its value, because several variables hold secrets.
package config

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Config is the whole service configuration.
type Config struct {
	HTTPAddr string // HAN_HTTP_ADDR, default 127.0.0.1:8080
	// MetricsAddr (HAN_METRICS_ADDR), when set, serves /metrics on its own
	// listener and not on HTTPAddr. Zero value: /metrics on HTTPAddr.
	MetricsAddr      string
	RedisURL         string   // REDIS_URL (DB0)
	RedisRealtimeURL string   // REDIS_REALTIME_URL (DB1)
	DatabaseURL      string   // DATABASE_URL
	Env              string   // HAN_ENV, default dev; a name (IsName)
	InstanceID       string   // HAN_INSTANCE_ID, default hostname + random suffix; a name (IsName)
	JWTIssuer        string   // HAN_JWT_ISSUER
	JWTAudience      string   // HAN_JWT_AUDIENCE
	JWKSURL          string   // HAN_JWKS_URL
	JWKSFile         string   // HAN_JWKS_FILE
	DevHS256Secret   string   // HAN_JWT_DEV_HS256_SECRET (refused when HAN_ENV=prod)
	AllowedOrigins   []string // HAN_ALLOWED_ORIGINS: WebSocket handshakes
	// CORSOrigins (HAN_CORS_ORIGINS) are the exact origins whose pages may
	// call the REST API; separate from AllowedOrigins because a page may
	// call REST from one origin and open sockets from another.
	CORSOrigins       []string
	HMACSecret        string // HAN_HMAC_SECRET
	LegacyStubEnabled bool   // HAN_LEGACY_STUB_ENABLED
	LegacyStubURL     string // HAN_LEGACY_STUB_URL
	// PublicRealtimeURL (HAN_PUBLIC_REALTIME_URL) is the realtimeUrl of
	// /v1/public/config; required when HAN_ENV=prod, because a URL built
	// from the request's Host would let any client choose it.
	PublicRealtimeURL string
	// RedisTimeout (HAN_REDIS_TIMEOUT, default 1s, 1ms to 10s) is the
	// budget of one Redis command; ShutdownTimeout (HAN_SHUTDOWN_TIMEOUT,
	// default 15s, at most 1h) that of the shutdown after the drain delay.
	// bounds.go says why each bound is where it is.
	RedisTimeout    time.Duration
	ShutdownTimeout time.Duration
	// DrainDelay (HAN_DRAIN_DELAY, default 5s, 0 to 10m) is how long the
	// listener keeps serving after SIGTERM while /readyz already answers
	// 503, so load balancers see the instance leave before it stops
	// accepting connections.
	DrainDelay time.Duration
	// DBRequestTimeout (HAN_DB_REQUEST_TIMEOUT, default 2s) bounds a
	// request's wait for a PostgreSQL connection, each lock wait and each
	// statement of its transaction; past it the request answers 503
	// database_busy. At least 1ms (PostgreSQL counts in milliseconds).
	DBRequestTimeout time.Duration
	// SendDialogQueue (HAN_SEND_DIALOG_QUEUE, default 256) is how many
	// sends into one dialog an instance holds at once, waiting and being
	// written, at most 8 of them from one sender; they are combined into
	// one transaction per batch, and one more send answers 503
	// dialog_busy.
	SendDialogQueue int
	// SendCommitters (HAN_SEND_COMMITTERS, default 1) is how many send
	// transactions an instance runs at once; the batches of different
	// dialogs that wait for one are written together in one transaction.
	SendCommitters int
	// SendLinger (HAN_SEND_LINGER, default 5ms, at most a quarter of
	// DBRequestTimeout; 0 turns it off) is how long a send transaction that
	// could start at once waits for the sends of other dialogs to join it:
	// fewer commits per send at moderate rates, for that much more latency.
	SendLinger time.Duration
	// IdempotencyLinger (HAN_IDEMPOTENCY_LINGER, default 2ms, at most a
	// quarter of RedisTimeout; 0 turns it off) is how long a keyed write's idempotency reserve (with its
	// rate-limit decision) that finds the shared Redis pipeline free waits
	// for other requests' scripts to join it.
	IdempotencyLinger time.Duration
	// WSLinger (HAN_WS_LINGER, default 5ms, at most a quarter of
	// RedisTimeout and of DBRequestTimeout; 0 turns it off) is how long the
	// shared work of handshakes and subscribes (presence registrations and
	// removals in Redis, subscribe checks, the presence transitions' dialog
	// reads and first-sight user records in PostgreSQL) waits for company
	// when its pipeline or statement is free.
	WSLinger time.Duration
	// DatabaseDirectURL (HAN_DATABASE_DIRECT_URL, default DatabaseURL) is a
	// connection straight to PostgreSQL, for migrations, when DatabaseURL
	// goes through a transaction-pooling proxy such as PgBouncer.
	DatabaseDirectURL string
	// PubSubMode (HAN_PUBSUB_MODE: auto, sharded or classic; default auto)
	// is how realtime channels travel on REDIS_REALTIME_URL: auto is
	// sharded Pub/Sub on a Redis Cluster and classic on a standalone Redis;
	// classic forces SUBSCRIBE/PUBLISH on a cluster too. Sharded on a
	// standalone Redis is refused when the service starts.
	PubSubMode string
	// DBExecMode (HAN_DB_EXEC_MODE) is how pgx sends statements on
	// DatabaseURL (store.ParseExecMode tells the modes apart); zero value:
	// pgx's default, cache_statement. Behind PgBouncer in transaction
	// pooling: exec or simple_protocol.
	DBExecMode string
	// Realtime: HAN_INSTANCE_LIVENESS_TTL (default 10s; 1s to 24h and more
	// than 1.5 × HAN_REDIS_TIMEOUT, since the marker is refreshed every third
	// of it and a refresh may take the Redis timeout), HAN_PRESENCE_SWEEP_INTERVAL
	// (default 5s, 10ms to 24h) bound how long a crashed instance's users stay online;
	// HAN_OUTBOX_GRACE (default 5s, 1s to 10m, less than the retention) is how old an unpublished
	// outbox row must be before the relay publishes it; the request path
	// marks its published rows delivered in batches within 50 ms
	// (store.MarkFlushInterval), so the grace stays at twenty times that or
	// more and the relay does not publish those rows again.
	// HAN_OUTBOX_RETENTION (default 15m, at most 168h) is how long a delivered outbox row
	// is kept after its delivery before the purge deletes it.
	InstanceLivenessTTL time.Duration
	SweepInterval       time.Duration
	OutboxGrace         time.Duration
	OutboxRetention     time.Duration
	// Idempotency and attachments: HAN_IDEMPOTENCY_TTL (default 24h, 1s to 168h) is the
	// life of idempotency records in Redis and PostgreSQL; HAN_BLOB_DIR
	// (default <temp dir>/han-blobs) the local attachment folder;
	// HAN_ATTACHMENT_MAX_BYTES (default 25 MiB) the largest attachment;
	// HAN_ATTACHMENT_UNSENT_TTL (default 24h, 1h to 720h) how long an
	// uploaded attachment no message links is kept after its upload before
	// the janitor deletes it and its blob (never sooner than
	// HAN_IDEMPOTENCY_TTL after its upload URL expired, for init replays).
	IdempotencyTTL      time.Duration
	BlobDir             string
	AttachmentMaxBytes  int64
	AttachmentUnsentTTL time.Duration
	// ProjectModuleLeaseBytes (HAN_PROJECT_MODULE_LEASE_BYTES, default and
	// most 65536, 0 turns leases off) is the lease this instance takes on
	// the project API's module budget so most publishes make one Redis
	// call; near the module cap publishes reserve exactly either way.
	ProjectModuleLeaseBytes int64
	LogLevel                string // HAN_LOG_LEVEL: debug|info|warn|error, default info
	// Legacy safety stub budgets (only while HAN_LEGACY_STUB_ENABLED; zero
	// values mean the defaults of package legacystub, which refuses a task
	// TTL that does not cover poll interval × max polls + recovery budget):
	// HAN_LEGACY_STUB_POLL_INTERVAL (2s), HAN_LEGACY_STUB_MAX_POLLS (30),
	// HAN_LEGACY_STUB_RECOVERY_BUDGET (120s), HAN_LEGACY_STUB_TASK_TTL
	// (their sum, 180s).
	LegacyStubPollInterval   time.Duration
	LegacyStubMaxPolls       int
	LegacyStubRecoveryBudget time.Duration
	LegacyStubTaskTTL        time.Duration
	// SettingsRefreshInterval (HAN_SETTINGS_REFRESH_INTERVAL, default 5s,
	// 10ms to 24h) bounds how long a runtime settings change in PostgreSQL takes to
	// reach an instance.
	SettingsRefreshInterval time.Duration
	// WSMaxConnsPerUser (HAN_WS_MAX_CONNS_PER_USER, default 16) caps one
	// user's open WebSocket connections across all instances.
	WSMaxConnsPerUser int
	// WSRecoverWindow (HAN_WS_RECOVER_WINDOW, default 10m or
	// HAN_OUTBOX_RETENTION when shorter, at most HAN_OUTBOX_RETENTION) is how old a missed message may be for a
	// subscribe with sinceSeq to replay it over the socket; WSRecoverMax
	// (HAN_WS_RECOVER_MAX, default 100, at most 10000) is the most events replayed. Beyond
	// either the client gets a resync for the dialog and reconciles over
	// REST.
	WSRecoverWindow time.Duration
	WSRecoverMax    int
	// One user's recovery reads on an instance (a subscribe with sinceSeq
	// that no read of its dialog under way or lingering serves):
	// WSRecoverReadRate a second (HAN_WS_RECOVER_READ_RATE, default 2,
	// from 0.001 to 1000), at most WSRecoverReadBurst at once
	// (HAN_WS_RECOVER_READ_BURST, default 200, at most 1,000,000); one more
	// is answered with the dialog's resync.
	WSRecoverReadRate  float64
	WSRecoverReadBurst int
	// WSPresenceDelay (HAN_WS_PRESENCE_DELAY, default and most 1s, 0: at
	// once) is how long a presence.changed frame may wait for other frames
	// to the same socket, so a burst of transitions shares writes.
	WSPresenceDelay time.Duration
	// Handshake admission: WSHandshakeConcurrency
	// (HAN_WS_HANDSHAKE_CONCURRENCY; 0, the default, means twice the
	// PostgreSQL pool plus the realtime Redis pool) handshakes do their
	// Redis and PostgreSQL work at once; up to WSHandshakeQueue
	// (HAN_WS_HANDSHAKE_QUEUE, default 16384) more wait, each at most
	// WSHandshakeWait (HAN_WS_HANDSHAKE_WAIT, default 6s, at most 1m); beyond that a
	// handshake is closed with 1013 and a reconnect delay. The defaults let
	// a whole instance's sockets (10,000 measured) reconnect after a restart
	// without a refusal: a queued handshake is an accepted socket, already
	// counted against HAN_MAX_CONNECTIONS, and the sockets come back within
	// the drain's 0.5–5 s advice plus the restart.
	WSHandshakeConcurrency int
	WSHandshakeQueue       int
	WSHandshakeWait        time.Duration
	// One user's handshakes on an instance: WSUserHandshakeRate a second
	// (HAN_WS_USER_HANDSHAKE_RATE, default 1, from 0.001 to 1000), at most
	// WSUserHandshakeBurst at once (HAN_WS_USER_HANDSHAKE_BURST, default 32,
	// at most 1,000,000); one more is closed with
	// 1013 and a reconnect delay.
	WSUserHandshakeRate  float64
	WSUserHandshakeBurst int
	// Each client address's budget of refused credentials on the REST API:
	// AuthFailBurst (HAN_AUTH_FAIL_BURST, default 20, 1 to 1,000,000) at
	// once, then AuthFailRate (HAN_AUTH_FAIL_RATE, default 1, 0.001 to 1000)
	// a second; past it 429 without verifying (bounds.go).
	AuthFailBurst int
	AuthFailRate  float64
	// The HTTP edge. HTTPBodyTimeout (HAN_HTTP_BODY_TIMEOUT, default 15s, at
	// most 1h) is the base of the per-request body read and response write deadlines;
	// HTTPIdleTimeout (HAN_HTTP_IDLE_TIMEOUT, default 120s, at most 1h) closes idle
	// keep-alive connections. MaxConnections (HAN_MAX_CONNECTIONS) and
	// MaxConnsPerIP (HAN_MAX_CONNS_PER_IP) cap open client connections;
	// zero means "derive at start-up" from the descriptor limit and the
	// pool sizes. TrustedProxies (HAN_TRUSTED_PROXIES) are the peers whose
	// forwarding headers are believed; ForwardedHeader
	// (HAN_FORWARDED_HEADER) names the one header those proxies write:
	// "x-forwarded-for" (default: X-Forwarded-For and X-Forwarded-Proto)
	// or "forwarded" (RFC 7239 Forwarded); the other is ignored.
	HTTPBodyTimeout time.Duration
	HTTPIdleTimeout time.Duration
	MaxConnections  int
	MaxConnsPerIP   int
	TrustedProxies  []netip.Prefix
	ForwardedHeader string
}

// ErrInvalid wraps every validation failure.
var ErrInvalid = errors.New("config: invalid configuration")

// Load reads configuration through getenv and validates it.
func Load(getenv func(string) string) (Config, error) {
	c := Config{
		HTTPAddr:          or(getenv("HAN_HTTP_ADDR"), "127.0.0.1:8080"),
		MetricsAddr:       getenv("HAN_METRICS_ADDR"),
		RedisURL:          getenv("REDIS_URL"),
		RedisRealtimeURL:  getenv("REDIS_REALTIME_URL"),
		DatabaseURL:       getenv("DATABASE_URL"),
		Env:               or(getenv("HAN_ENV"), "dev"),
		InstanceID:        getenv("HAN_INSTANCE_ID"),
		JWTIssuer:         getenv("HAN_JWT_ISSUER"),
		JWTAudience:       getenv("HAN_JWT_AUDIENCE"),
		JWKSURL:           getenv("HAN_JWKS_URL"),
		JWKSFile:          getenv("HAN_JWKS_FILE"),
		DevHS256Secret:    getenv("HAN_JWT_DEV_HS256_SECRET"),
		HMACSecret:        getenv("HAN_HMAC_SECRET"),
		LegacyStubURL:     getenv("HAN_LEGACY_STUB_URL"),
		PublicRealtimeURL: getenv("HAN_PUBLIC_REALTIME_URL"),
		LogLevel:          or(getenv("HAN_LOG_LEVEL"), "info"),
	}
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	c.checkListenAddrs(bad) // bounds.go
	c.AllowedOrigins = origins("HAN_ALLOWED_ORIGINS", getenv("HAN_ALLOWED_ORIGINS"), bad)
	c.CORSOrigins = origins("HAN_CORS_ORIGINS", getenv("HAN_CORS_ORIGINS"), bad)
	var err error
	if c.RedisTimeout, err = duration(getenv("HAN_REDIS_TIMEOUT"), time.Second); err != nil ||
		c.RedisTimeout < time.Millisecond || c.RedisTimeout > maxRedisTimeout {
		bad("HAN_REDIS_TIMEOUT: must be a duration of 1ms to 10s like 1s")
	}
	if c.ShutdownTimeout, err = duration(getenv("HAN_SHUTDOWN_TIMEOUT"), 15*time.Second); err != nil || c.ShutdownTimeout > maxShutdownTimeout {
		bad("HAN_SHUTDOWN_TIMEOUT: must be a duration above 0, at most 1h, like 15s")
	}
	if c.DrainDelay, err = time.ParseDuration(cmp.Or(getenv("HAN_DRAIN_DELAY"), "5s")); err != nil || c.DrainDelay < 0 || c.DrainDelay > maxDrainDelay {
		bad("HAN_DRAIN_DELAY: must be a duration of 0 to 10m like 5s")
	}
	// At most an hour: it becomes the transactions' lock_timeout and
	// statement_timeout, which PostgreSQL takes only up to 2^31-1 ms, and a
	// request that may wait longer is no request budget.
	if c.DBRequestTimeout, err = duration(getenv("HAN_DB_REQUEST_TIMEOUT"), 2*time.Second); err != nil ||
		c.DBRequestTimeout < time.Millisecond || c.DBRequestTimeout > time.Hour {
		bad("HAN_DB_REQUEST_TIMEOUT: must be a duration of 1ms to 1h like 2s")
	}
	// describe_exec, pgx's fifth mode, is left out on purpose: its two round
	// trips may reach two server connections behind a pooling proxy.
	switch c.DBExecMode = getenv("HAN_DB_EXEC_MODE"); c.DBExecMode {
	case "", "cache_statement", "cache_describe", "exec", "simple_protocol":
	default:
		bad("HAN_DB_EXEC_MODE: must be cache_statement, cache_describe, exec or simple_protocol")
	}
	switch c.PubSubMode = cmp.Or(getenv("HAN_PUBSUB_MODE"), "auto"); c.PubSubMode {
	case "auto", "sharded", "classic":
	default:
		bad("HAN_PUBSUB_MODE: must be auto, sharded or classic")
	}
	if c.InstanceLivenessTTL, err = duration(getenv("HAN_INSTANCE_LIVENESS_TTL"), 10*time.Second); err != nil {
		bad("HAN_INSTANCE_LIVENESS_TTL: %v", err)
	} else if c.InstanceLivenessTTL < time.Second || c.InstanceLivenessTTL > maxLoopInterval ||
		3*float64(c.RedisTimeout) >= 2*float64(c.InstanceLivenessTTL) {
		// The marker is refreshed every third of its TTL and a refresh may
		// take HAN_REDIS_TIMEOUT: shorter, a running instance's marker
		// expires and the others sweep its open connections out of presence.
		// (Compared as floats: three times a huge duration overflows.)
		bad("HAN_INSTANCE_LIVENESS_TTL: must be 1s to 24h and more than 1.5 × HAN_REDIS_TIMEOUT")
	}
	if c.SweepInterval, err = duration(getenv("HAN_PRESENCE_SWEEP_INTERVAL"), 5*time.Second); err != nil ||
		c.SweepInterval < minLoopInterval || c.SweepInterval > maxLoopInterval {
		bad("HAN_PRESENCE_SWEEP_INTERVAL: must be a duration of 10ms to 24h like 5s")
	}
	if c.OutboxRetention, err = duration(getenv("HAN_OUTBOX_RETENTION"), 15*time.Minute); err != nil || c.OutboxRetention > maxOutboxRetention {
		bad("HAN_OUTBOX_RETENTION: must be a duration above 0, at most 168h (7 days), like 15m")
	}
	if c.OutboxGrace, err = duration(getenv("HAN_OUTBOX_GRACE"), 5*time.Second); err != nil || c.OutboxGrace < time.Second ||
		c.OutboxGrace > maxOutboxGrace {
		bad("HAN_OUTBOX_GRACE: must be a duration of 1s to 10m like 5s")
	} else if c.OutboxGrace >= c.OutboxRetention && c.OutboxRetention > 0 {
		// The purge counts undelivered rows older than the retention as
		// stuck (han_outbox_undelivered_past_retention): rows the relay is still
		// meant to wait for would read as stuck.
		bad("HAN_OUTBOX_GRACE: must be less than HAN_OUTBOX_RETENTION")
	}
	// Records expire in whole milliseconds: a life under a second would be
	// none, and idempotency off without a word.
	if c.IdempotencyTTL, err = duration(getenv("HAN_IDEMPOTENCY_TTL"), 24*time.Hour); err != nil ||
		c.IdempotencyTTL < time.Second || c.IdempotencyTTL > maxIdempotencyTTL {
		bad("HAN_IDEMPOTENCY_TTL: must be a duration of 1s to 168h (7 days) like 24h")
	}
	c.BlobDir = getenv("HAN_BLOB_DIR")
	c.AttachmentMaxBytes = 25 << 20
	if v := getenv("HAN_ATTACHMENT_MAX_BYTES"); v != "" {
		if c.AttachmentMaxBytes, err = strconv.ParseInt(v, 10, 64); err != nil || c.AttachmentMaxBytes < 1 {
			bad("HAN_ATTACHMENT_MAX_BYTES: must be a positive number of bytes")
		}
	}
	if c.AttachmentUnsentTTL, err = duration(getenv("HAN_ATTACHMENT_UNSENT_TTL"), 24*time.Hour); err != nil ||
		c.AttachmentUnsentTTL < time.Hour || c.AttachmentUnsentTTL > maxAttachmentUnsentTTL {
		// Shorter, an attachment could go while its message is still being
		// written, and the send would fail with invalid_attachment.
		bad("HAN_ATTACHMENT_UNSENT_TTL: must be a duration of 1h to 720h (30 days) like 24h")
	}
	c.ProjectModuleLeaseBytes = 64 << 10
	if v := getenv("HAN_PROJECT_MODULE_LEASE_BYTES"); v != "" {
		if c.ProjectModuleLeaseBytes, err = strconv.ParseInt(v, 10, 64); err != nil || c.ProjectModuleLeaseBytes < 0 ||
			c.ProjectModuleLeaseBytes > 64<<10 {
			bad("HAN_PROJECT_MODULE_LEASE_BYTES: must be 0..65536 bytes")
		}
	}
	if v := getenv("HAN_LEGACY_STUB_ENABLED"); v != "" {
		if c.LegacyStubEnabled, err = strconv.ParseBool(v); err != nil {
			bad("HAN_LEGACY_STUB_ENABLED: must be true or false")
		}
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"HAN_LEGACY_STUB_POLL_INTERVAL", &c.LegacyStubPollInterval}, {"HAN_LEGACY_STUB_RECOVERY_BUDGET", &c.LegacyStubRecoveryBudget},
		{"HAN_LEGACY_STUB_TASK_TTL", &c.LegacyStubTaskTTL}} {
		if *d.dst, err = duration(getenv(d.name), 0); err != nil {
			bad("%s: %v", d.name, err)
		}
	}
	if v := getenv("HAN_LEGACY_STUB_MAX_POLLS"); v != "" {
		if c.LegacyStubMaxPolls, err = strconv.Atoi(v); err != nil || c.LegacyStubMaxPolls < 1 {
			bad("HAN_LEGACY_STUB_MAX_POLLS: must be a positive number")
		}
	}
	if c.SettingsRefreshInterval, err = duration(getenv("HAN_SETTINGS_REFRESH_INTERVAL"), 5*time.Second); err != nil ||
		c.SettingsRefreshInterval < minLoopInterval || c.SettingsRefreshInterval > maxLoopInterval {
		bad("HAN_SETTINGS_REFRESH_INTERVAL: must be a duration of 10ms to 24h like 5s")
	}
	c.SendDialogQueue = 256
	if v := getenv("HAN_SEND_DIALOG_QUEUE"); v != "" {
		if c.SendDialogQueue, err = strconv.Atoi(v); err != nil || c.SendDialogQueue < 1 {
			bad("HAN_SEND_DIALOG_QUEUE: must be a positive number")
		}
	}
	c.SendCommitters = 1
	if v := getenv("HAN_SEND_COMMITTERS"); v != "" {
		if c.SendCommitters, err = strconv.Atoi(v); err != nil || c.SendCommitters < 1 {
			bad("HAN_SEND_COMMITTERS: must be a positive number")
		}
	}
	c.readLingers(getenv, bad)  // bounds.go
	c.readAuthFail(getenv, bad) // bounds.go
	c.WSMaxConnsPerUser = 16
	if v := getenv("HAN_WS_MAX_CONNS_PER_USER"); v != "" {
		if c.WSMaxConnsPerUser, err = strconv.Atoi(v); err != nil || c.WSMaxConnsPerUser < 1 {
			bad("HAN_WS_MAX_CONNS_PER_USER: must be a positive number")
		}
	}
	// Unset, the window is 10 minutes or the outbox retention when that is
	// shorter, as the lingers' defaults shrink to fit their budgets: only a
	// window set longer than the retention is refused.
	if c.WSRecoverWindow, err = duration(getenv("HAN_WS_RECOVER_WINDOW"), min(10*time.Minute, c.OutboxRetention)); err != nil {
		bad("HAN_WS_RECOVER_WINDOW: %v", err)
	} else if c.WSRecoverWindow > c.OutboxRetention {
		// Rows older than the retention may be purged: replaying from them
		// would miss events.
		bad("HAN_WS_RECOVER_WINDOW: must not exceed HAN_OUTBOX_RETENTION")
	}
	c.WSRecoverMax = 100
	if v := getenv("HAN_WS_RECOVER_MAX"); v != "" {
		if c.WSRecoverMax, err = strconv.Atoi(v); err != nil || c.WSRecoverMax < 1 || c.WSRecoverMax > maxRecoverEvents {
			bad("HAN_WS_RECOVER_MAX: must be a positive number, at most 10000")
		}
	}
	c.readRecoverReads(getenv, bad) // bounds.go
	c.WSPresenceDelay = time.Second
	if v := getenv("HAN_WS_PRESENCE_DELAY"); v != "" {
		if c.WSPresenceDelay, err = time.ParseDuration(v); err != nil || c.WSPresenceDelay < 0 || c.WSPresenceDelay > time.Second {
			bad("HAN_WS_PRESENCE_DELAY: must be a duration from 0 to 1s")
		}
	}
	c.WSHandshakeQueue = 16384
	for _, n := range []struct {
		name string
		dst  *int
	}{{"HAN_WS_HANDSHAKE_CONCURRENCY", &c.WSHandshakeConcurrency}, {"HAN_WS_HANDSHAKE_QUEUE", &c.WSHandshakeQueue}} {
		if v := getenv(n.name); v != "" {
			if *n.dst, err = strconv.Atoi(v); err != nil || *n.dst < 1 {
				bad("%s: must be a positive number", n.name)
			}
		}
	}
	if c.WSHandshakeWait, err = duration(getenv("HAN_WS_HANDSHAKE_WAIT"), 6*time.Second); err != nil || c.WSHandshakeWait > maxHandshakeWait {
		bad("HAN_WS_HANDSHAKE_WAIT: must be a duration above 0, at most 1m, like 6s")
	}
	c.WSUserHandshakeRate = 1
	if v := getenv("HAN_WS_USER_HANDSHAKE_RATE"); v != "" {
		// ParseFloat takes NaN and Inf: the range check refuses both.
		if c.WSUserHandshakeRate, err = strconv.ParseFloat(v, 64); err != nil ||
			!(c.WSUserHandshakeRate >= minUserHandshakeRate && c.WSUserHandshakeRate <= maxUserHandshakeRate) {
			bad("HAN_WS_USER_HANDSHAKE_RATE: must be a number of handshakes a second from 0.001 to 1000")
		}
	}
	c.WSUserHandshakeBurst = 32
	if v := getenv("HAN_WS_USER_HANDSHAKE_BURST"); v != "" {
		if c.WSUserHandshakeBurst, err = strconv.Atoi(v); err != nil || c.WSUserHandshakeBurst < 1 ||
			c.WSUserHandshakeBurst > maxUserHandshakeBurst {
			bad("HAN_WS_USER_HANDSHAKE_BURST: must be a number from 1 to 1000000")
		}
	}
	if c.HTTPBodyTimeout, err = duration(getenv("HAN_HTTP_BODY_TIMEOUT"), 15*time.Second); err != nil || c.HTTPBodyTimeout > maxBodyTimeout {
		bad("HAN_HTTP_BODY_TIMEOUT: must be a duration above 0, at most 1h, like 15s")
	}
	if c.HTTPIdleTimeout, err = duration(getenv("HAN_HTTP_IDLE_TIMEOUT"), 120*time.Second); err != nil || c.HTTPIdleTimeout > maxIdleTimeout {
		bad("HAN_HTTP_IDLE_TIMEOUT: must be a duration above 0, at most 1h, like 120s")
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{{"HAN_MAX_CONNECTIONS", &c.MaxConnections}, {"HAN_MAX_CONNS_PER_IP", &c.MaxConnsPerIP}} {
		if v := getenv(n.name); v != "" {
			if *n.dst, err = strconv.Atoi(v); err != nil || *n.dst < 1 {
				bad("%s: must be a positive number", n.name)
			}
		}
	}
	if c.TrustedProxies, err = prefixes(getenv("HAN_TRUSTED_PROXIES")); err != nil {
		bad("HAN_TRUSTED_PROXIES: %v", err)
	}
	switch c.ForwardedHeader = strings.ToLower(strings.TrimSpace(getenv("HAN_FORWARDED_HEADER"))); c.ForwardedHeader {
	case "":
		c.ForwardedHeader = "x-forwarded-for"
	case "x-forwarded-for", "forwarded":
	default:
		bad("HAN_FORWARDED_HEADER: must be x-forwarded-for or forwarded")
	}
	if c.PublicRealtimeURL != "" {
		if u, err := url.Parse(c.PublicRealtimeURL); err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			bad("HAN_PUBLIC_REALTIME_URL: must be a ws:// or wss:// URL")
		}
	} else if IsProd(c.Env) {
		bad("HAN_PUBLIC_REALTIME_URL: required when HAN_ENV=prod")
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "han"
		}
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		c.InstanceID = asName(host) + "-" + hex.EncodeToString(b)
	}
	if !IsName(c.InstanceID) {
		bad("HAN_INSTANCE_ID: must be a name of letters, digits, '.', '_' and '-' only")
	}
	if !IsName(c.Env) {
		bad("HAN_ENV: must be a name of letters, digits, '.', '_' and '-' only")
	}
	checkRedis := func(name, v string) {
		if v == "" {
			bad("%s: required", name)
			return
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
			bad("%s: must be a redis:// or rediss:// URL", name)
		} else if atAfterHost(u) {
			bad("%s", unencodedPassword(name))
		}
	}
	checkRedis("REDIS_URL", c.RedisURL)
	checkRedis("REDIS_REALTIME_URL", c.RedisRealtimeURL)
	if c.LegacyStubEnabled {
		checkRedis("HAN_LEGACY_STUB_URL", c.LegacyStubURL)
	}
	checkPG := func(name, v string) {
		if u, err := url.Parse(v); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			bad("%s: must be a postgres:// URL", name)
		} else if atAfterHost(u) {
			bad("%s", unencodedPassword(name))
		}
	}
	if c.DatabaseURL == "" {
		bad("DATABASE_URL: required")
	} else {
		checkPG("DATABASE_URL", c.DatabaseURL)
	}
	if c.DatabaseDirectURL = getenv("HAN_DATABASE_DIRECT_URL"); c.DatabaseDirectURL == "" {
		c.DatabaseDirectURL = c.DatabaseURL
	} else {
		checkPG("HAN_DATABASE_DIRECT_URL", c.DatabaseDirectURL)
	}
	if len(c.HMACSecret) < 16 {
		bad("HAN_HMAC_SECRET: required, at least 16 bytes")
	}
	if c.JWKSURL == "" && c.JWKSFile == "" && c.DevHS256Secret == "" {
		bad("auth: set HAN_JWKS_URL or HAN_JWKS_FILE (or HAN_JWT_DEV_HS256_SECRET outside prod)")
	}
	if c.JWKSURL != "" && c.JWKSFile != "" {
		bad("auth: set only one of HAN_JWKS_URL and HAN_JWKS_FILE")
	}
	if c.DevHS256Secret != "" {
		if IsProd(c.Env) {
			bad("HAN_JWT_DEV_HS256_SECRET: refused when HAN_ENV=prod")
		} else if len(c.DevHS256Secret) < 32 {
			bad("HAN_JWT_DEV_HS256_SECRET: at least 32 bytes")
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("HAN_LOG_LEVEL: one of debug, info, warn, error")
	}
	if len(problems) > 0 {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalid, strings.Join(problems, "; "))
	}
	return c, nil
}

// minLoopInterval is the shortest interval of a background loop that
// reads Redis or PostgreSQL on every turn (the presence sweep, the
// settings refresh): shorter, a typo such as 1ns would spin against them.
const minLoopInterval = 10 * time.Millisecond

// IsProd reports whether env names production: "prod" or "production",
// in any case (the JWT verifier reads it the same way).
func IsProd(env string) bool {
	return strings.EqualFold(env, "prod") || strings.EqualFold(env, "production")
}

func or(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// linger parses a wait for company: 0 (off) up to 100ms.
func linger(v string, d time.Duration) (time.Duration, error) {
	if v == "" {
		return d, nil
	}
	x, err := time.ParseDuration(v)
	if err != nil || x < 0 || x > 100*time.Millisecond {
		return 0, errors.New("must be a duration from 0 to 100ms like 5ms")
	}
	return x, nil
}

func duration(v string, d time.Duration) (time.Duration, error) {
	if v == "" {
		return d, nil
	}
	x, err := time.ParseDuration(v)
	if err != nil || x <= 0 {
		return 0, errors.New("must be a positive duration like 1s")
	}
	return x, nil
}

// prefixes parses a comma-separated list of CIDRs; a bare address counts
// as a single-address prefix.
func prefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, errors.New("each entry must be a CIDR like 10.0.0.0/8 or an IP address")
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// SameRedisInstance reports whether DB0 and DB1 URLs point at one server
// (then the ACL must allow the handshake SELECT). The addresses are
// compared as the client dials them: the default port filled in, the host
// in lower case, and the loopback names (localhost, 127.0.0.1, ::1) as one;
// a host name may be any address, so only two literal addresses (or ports)
// that differ are two servers. When in doubt it says "same": an ACL that
// allows SELECT on two servers only allows more, one that denies it on one
// server breaks DB1.
func SameRedisInstance(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	if err1 != nil || err2 != nil {
		return true
	}
	a1, a2 := redisDialAddr(ua), redisDialAddr(ub)
	if a1 == a2 {
		return true
	}
	// A name and an address, or two names, may be one server: only two
	// literal addresses (or two socket paths) are known to differ.
	if u1, u2 := strings.HasPrefix(a1, "unix:"), strings.HasPrefix(a2, "unix:"); u1 || u2 {
		return !(u1 && u2) // a socket and a TCP address may be one server; two sockets differ
	}
	h1, _, _ := net.SplitHostPort(a1)
	h2, _, _ := net.SplitHostPort(a2)
	_, e1 := netip.ParseAddr(h1)
	_, e2 := netip.ParseAddr(h2)
	return e1 != nil || e2 != nil
}

// redisDialAddr is where a redis:// or rediss:// URL dials, normalised
// (a unix:// URL: its socket path).
func redisDialAddr(u *url.URL) string {
	if u.Scheme == "unix" {
		return "unix:" + u.Path
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = "6379"
	}
	if host == "" || host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.") {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// origins parses a comma-separated list of exact origins
// (scheme://host[:port], an optional trailing slash dropped).
func origins(name, v string, bad func(string, ...any)) []string {
	var out []string
	for _, o := range strings.Split(v, ",") {
		if o = strings.TrimSpace(o); o != "" {
			u, err := url.Parse(o)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
				u.RawQuery != "" || u.Fragment != "" || u.User != nil {
				bad("%s: each entry must be an origin like https://chat.example.com", name)
				continue
			}
			if !ascii(u.Host) {
				// Browsers send an internationalized host name in Origin in
				// its ASCII form, so a Unicode entry would match no page.
				bad("%s: %q: write a host name that is not ASCII in its punycode form (xn--…), as browsers send it in Origin", name, o)
				continue
			}
			out = append(out, browserOrigin(u))
		}
	}
	return out
}

// ascii reports whether s is all ASCII.
func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// browserOrigin writes u as a browser sends it in Origin: scheme and host
// in lower case, the scheme's default port left out. Origins are compared
// as exact strings, so "https://Chat.example.com:443" in the configuration
// would match no browser.
func browserOrigin(u *url.URL) string {
	host := strings.ToLower(u.Host)
	switch {
	case u.Scheme == "https" && strings.HasSuffix(host, ":443"):
		host = strings.TrimSuffix(host, ":443")
	case u.Scheme == "http" && strings.HasSuffix(host, ":80"):
		host = strings.TrimSuffix(host, ":80")
	}
	return u.Scheme + "://" + host
}
