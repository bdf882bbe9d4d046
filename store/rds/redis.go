package rds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig tunes a Redis client. Every field's zero value picks the
// default shown.
type RedisConfig struct {
	PoolSize     int           // zero value means 10 per CPU
	MinIdleConns int           // zero value means 2
	DialTimeout  time.Duration // zero value means 1s
	ReadTimeout  time.Duration // zero value means 1s (the request's Redis budget)
	WriteTimeout time.Duration // zero value means 1s
	PoolTimeout  time.Duration // zero value means 1s: no request queues on a dead Redis past its budget
	MaxRetries   int           // zero value means 1 (negative: none)
	// MinRetryBackoff and MaxRetryBackoff bound go-redis's jittered
	// exponential backoff between retries and reconnects.
	MinRetryBackoff time.Duration // zero value means 8ms
	MaxRetryBackoff time.Duration // zero value means 512ms
	ClientName      string        // CLIENT SETNAME-style name for INFO/monitoring
}

// NewRedis opens a client for a redis:// or rediss:// URL: a standalone
// client, or a Redis Cluster client when IsClusterURL says the URL is a
// cluster URL. Either way it returns the redis.UniversalClient interface, so
// the call sites do not change (every key carries a hash tag). The URL's
// database number is used only through the connection handshake;
// application code never issues SELECT. A cluster has only database 0, so a
// cluster URL naming another database is refused.
func NewRedis(url string, c RedisConfig) (redis.UniversalClient, error) {
	if IsClusterURL(url) {
		opt, err := ParseClusterURL(url)
		if err != nil {
			return nil, err
		}
		applyClusterDefaults(opt, c)
		cc := redis.NewClusterClient(opt)
		cc.AddHook(slotMapReloader{cc})
		// A Pub/Sub connection is dialled outside any command: a node that
		// refuses it must reload the map too, or a subscriber keeps dialling
		// the dead master of its first channel's slot.
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(nodeDialReloader{cc}) })
		return cc, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		// The URL holds a password: never echo it.
		return nil, errors.New("store: invalid redis URL")
	}
	applyRedisDefaults(opt, c)
	return redis.NewClient(opt), nil
}

// ErrClusterDB refuses a cluster URL whose path names a database other
// than 0: Redis Cluster has only database 0.
var ErrClusterDB = errors.New("store: a Redis Cluster URL must use database 0 (the path may be empty, / or /0)")

// IsClusterURL reports whether url is a Redis Cluster URL. The rule is
// go-redis's own: a URL carrying one or more addr= query parameters is
// redis.ParseClusterURL's form (the host is the first seed node, each addr=
// another one), while redis.ParseURL refuses addr=; a universal client
// likewise becomes a cluster client when it has more than one address. So a
// cluster URL names at least two seed nodes, e.g.
// redis://api_backend:pw@10.0.0.1:6379?addr=10.0.0.2:6379&addr=10.0.0.3:6379.
func IsClusterURL(rawURL string) bool {
	u, err := neturl.Parse(rawURL)
	return err == nil && u.Query().Has("addr")
}

// ParseClusterURL parses a cluster URL (IsClusterURL) into go-redis's
// options and checks that it names database 0. Its errors never echo the
// URL, which holds a password.
func ParseClusterURL(rawURL string) (*redis.ClusterOptions, error) {
	u, err := neturl.Parse(rawURL)
	if err != nil {
		return nil, errors.New("store: invalid redis cluster URL")
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" && db != "0" {
		return nil, ErrClusterDB
	}
	opt, err := redis.ParseClusterURL(rawURL)
	if err != nil {
		return nil, errors.New("store: invalid redis cluster URL")
	}
	return opt, nil
}

func applyClusterDefaults(opt *redis.ClusterOptions, c RedisConfig) {
	// One set of defaults for both kinds of client: fill a standalone
	// Options and copy the fields the cluster client shares. PoolSize and
	// MinIdleConns then apply per node, as go-redis defines them.
	var o redis.Options
	applyRedisDefaults(&o, c)
	opt.PoolSize, opt.MinIdleConns = o.PoolSize, o.MinIdleConns
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout
	opt.MinRetryBackoff, opt.MaxRetryBackoff, opt.MaxRetries = o.MinRetryBackoff, o.MaxRetryBackoff, o.MaxRetries
	opt.DialerRetries = o.DialerRetries
	opt.ContextTimeoutEnabled = true
	if c.ClientName != "" {
		opt.ClientName = c.ClientName
	}
	opt.ClusterStateReloadInterval = ClusterSlotMapMaxAge
}

// ClusterSlotMapMaxAge is how old a cluster client's slot map may grow
// before its next command reloads it in the background (go-redis's default
// is a minute). slotMapReloader reloads it at once when a node stops
// answering; this bounds the staleness when nothing failed.
const ClusterSlotMapMaxAge = 5 * time.Second

// slotMapReloader reloads a cluster client's slot map (in the background,
// at most one reload at a time) whenever a command finds its node
// unreachable. go-redis follows MOVED on its own, but a master that died
// answers nothing: without a reload the client keeps sending that master's
// slots to the dead address until its map is old enough, long after the
// replica that took over is serving them.
type slotMapReloader struct{ c *redis.ClusterClient }

func (h slotMapReloader) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slotMapReloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && unreachable(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h slotMapReloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil && unreachable(e) {
				h.c.ReloadState(ctx)
				break
			}
		}
		return err
	}
}

// nodeDialReloader reloads the cluster client's slot map when a dial to
// one of its nodes fails.
type nodeDialReloader struct{ c *redis.ClusterClient }

func (h nodeDialReloader) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && unreachable(err) {
			h.c.ReloadState(ctx)
		}
		return conn, err
	}
}

func (h nodeDialReloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h nodeDialReloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func applyRedisDefaults(opt *redis.Options, c RedisConfig) {
	def := func(v, d time.Duration) time.Duration {
		if v == 0 {
			return d
		}
		return v
	}
	opt.PoolSize = 10 * runtime.GOMAXPROCS(0)
	if c.PoolSize > 0 {
		opt.PoolSize = c.PoolSize
	}
	opt.MinIdleConns = 2
	if c.MinIdleConns > 0 {
		opt.MinIdleConns = c.MinIdleConns
	}
	opt.DialTimeout = def(c.DialTimeout, time.Second)
	opt.ReadTimeout = def(c.ReadTimeout, time.Second)
	opt.WriteTimeout = def(c.WriteTimeout, time.Second)
	opt.PoolTimeout = def(c.PoolTimeout, time.Second)
	opt.MinRetryBackoff = def(c.MinRetryBackoff, 8*time.Millisecond)
	opt.MaxRetryBackoff = def(c.MaxRetryBackoff, 512*time.Millisecond)
	switch {
	case c.MaxRetries < 0:
		opt.MaxRetries = -1
	case c.MaxRetries == 0:
		opt.MaxRetries = 1
	default:
		opt.MaxRetries = c.MaxRetries
	}
	// One dial per connection attempt: go-redis dials a refused address
	// five times, 100 ms apart, by default, so every call to a Redis that is
	// down spent 0.8–1.2 s (the command's retry and the script runner's
	// included) before it could answer "unavailable". The command retry
	// above, and the script runner's for calls never sent, still cover a
	// dial that fails for a moment (a failover).
	opt.DialerRetries = 1
	opt.ContextTimeoutEnabled = true
	if c.ClientName != "" {
		opt.ClientName = c.ClientName
	}
}

// Redis error classes the API maps to stable codes (docs/errors.md), so no
// raw Redis error text reaches a client.
var (
	ErrRedisUnavailable = errors.New("store: redis unavailable")
	ErrRedisOOM         = errors.New("store: redis out of memory")
	ErrRedisNoPerm      = errors.New("store: redis permission denied")
	ErrExpiryDenied     = errors.New("store: redis expiry command denied")
)

// Unanswered reports whether a call failed without a reply from Redis (a
// timeout, a lost connection, a cancelled context): its bytes may have
// reached the server, or may still, and run there later. An error reply
// (OOM, NOPERM, a script's error) means the server answered.
func Unanswered(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply)
}

// ClassifyRedisError maps a go-redis error to one of the sentinel errors
// above (wrapping nothing of the raw text, which may hold values), or
// returns err unchanged when it is not a Redis failure (nil, redis.Nil).
func ClassifyRedisError(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrShardedNeedsCluster) {
		// A misconfigured Pub/Sub mode is not an outage of Redis.
		return err
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "expiry_denied"):
		return ErrExpiryDenied
	case strings.HasPrefix(msg, "OOM "), strings.Contains(msg, "OOM command not allowed"):
		return ErrRedisOOM
	case strings.HasPrefix(msg, "NOPERM"):
		return ErrRedisNoPerm
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, redis.ErrPoolTimeout) || strings.Contains(msg, "connection refused") ||
		strings.HasPrefix(msg, "LOADING") || strings.Contains(msg, "EOF") {
		return ErrRedisUnavailable
	}
	return fmt.Errorf("store: redis error: %w", ErrRedisUnavailable)
}

// RedisLogLinesPerSecond bounds the go-redis client lines SetRedisLogger
// lets through: a Redis outage makes the connection pools report every
// failed dial, which would otherwise flood the log.
const RedisLogLinesPerSecond = 5

// SetRedisLogger routes go-redis's own log lines (connection pool dial
// failures, discarded connections; a process-wide setting of the library)
// through logger as JSON at level Warn, message "redis client", at most
// RedisLogLinesPerSecond lines a second. A line carries the library's
// format string ("event"), never its formatted text: the arguments may hold
// addresses, command arguments or values. An error argument is reported by
// class ("kind"). The first line let through after a burst counts the lines
// dropped before it ("suppressed").
func SetRedisLogger(logger *slog.Logger) {
	redis.SetLogger(&redisLogger{logger: logger})
}

type redisLogger struct {
	logger     *slog.Logger
	mu         sync.Mutex
	window     time.Time // start of the current one-second window
	lines      int       // lines let through in the window
	suppressed int64     // lines dropped since the last one let through
}

func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	now := time.Now()
	l.mu.Lock()
	if now.Sub(l.window) >= time.Second {
		l.window, l.lines = now, 0
	}
	if l.lines >= RedisLogLinesPerSecond {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.lines++
	dropped := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()

	attrs := []slog.Attr{slog.String("event", strings.TrimSpace(format))}
	for _, a := range v {
		if err, ok := a.(error); ok {
			attrs = append(attrs, slog.String("kind", Kind(err)))
			break
		}
	}
	if dropped > 0 {
		attrs = append(attrs, slog.Int64("suppressed", dropped))
	}
	l.logger.LogAttrs(context.Background(), slog.LevelWarn, "redis client", attrs...)
}
