package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
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

// NewRedis opens a client for a redis:// URL. It returns the
// redis.UniversalClient interface so a ClusterClient can take its place
// without changes at the call sites (all keys carry hash tags). The URL's
// database number is used only through the connection handshake;
// application code never issues SELECT.
func NewRedis(url string, c RedisConfig) (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		// The URL holds a password: never echo it.
		return nil, errors.New("store: invalid redis URL")
	}
	applyRedisDefaults(opt, c)
	return redis.NewClient(opt), nil
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

// ClassifyRedisError maps a go-redis error to one of the sentinel errors
// above (wrapping nothing of the raw text, which may hold values), or
// returns err unchanged when it is not a Redis failure (nil, redis.Nil).
func ClassifyRedisError(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if errors.Is(err, context.Canceled) {
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
