package rds

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/loop"
)

// HealthConfig tunes a RedisHealth.
type HealthConfig struct {
	// ProbeInterval is the pause between PINGs while Redis is down. Zero
	// value means 250ms.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one PING. Zero value means 1s.
	ProbeTimeout time.Duration
	// OnChange, when set, is called (from the goroutine that noticed) each
	// time the state flips; down is the new state. It must not block.
	OnChange func(down bool)
}

// RedisHealth is the fast-failure state of one Redis client
// (docs/degraded-mode.md):
// an operation that finds Redis unreachable marks it down, and from then on
// Check fails at once instead of letting every request wait out its timeout
// budget on a dead server. While down, a prober goroutine PINGs it every
// ProbeInterval and marks it up again on the first answer, so recovery needs
// no restart. The prober runs only while Redis is down; Close stops it.
//
// Only unreachability counts (connection refused or reset, timeouts, a
// closed pool, LOADING): OOM, NOPERM and script errors are answers from a
// live server and leave the state alone. A RedisHealth is safe for
// concurrent use.
//
// On a Redis Cluster client a call's failure is its master's: CheckKey and
// ObserveKey track each master apart (health_masters.go), so a master that
// stalls or dies fails fast only the calls on its own keys.
type RedisHealth struct {
	c       redis.UniversalClient
	cluster *redis.ClusterClient // nil on a standalone client
	cfg     HealthConfig
	logger  *slog.Logger

	down     atomic.Bool // the whole of Redis (MarkDown, Observe)
	masters  masterDowns // on a cluster, the masters found unreachable
	reported atomic.Bool // the state OnChange was last told
	prober   *loop.Loop
}

// NewRedisHealth tracks c. logger may be nil.
func NewRedisHealth(c redis.UniversalClient, cfg HealthConfig, logger *slog.Logger) *RedisHealth {
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 250 * time.Millisecond
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &RedisHealth{c: c, cfg: cfg, logger: logger}
	h.cluster, _ = c.(*redis.ClusterClient)
	h.prober = loop.New(loop.Config{Interval: cfg.ProbeInterval, Immediate: true, Timeout: cfg.ProbeTimeout}, h.probe)
	return h
}

// Down reports whether Redis, or on a cluster one of its masters, is
// currently considered unreachable.
func (h *RedisHealth) Down() bool {
	return h != nil && (h.down.Load() || h.masters.n.Load() > 0)
}

// Check returns ErrRedisUnavailable at once while Redis is down, else nil
// (on a cluster, a master found unreachable is CheckKey's). A nil
// RedisHealth never fails.
func (h *RedisHealth) Check() error {
	if h != nil && h.down.Load() {
		return ErrRedisUnavailable
	}
	return nil
}

// Observe classifies the result of a Redis call (ClassifyRedisError) and,
// on a standalone client, marks Redis down when it says the server could
// not be reached. It returns the classified error.
//
// On a Redis Cluster client it marks nothing down: a call's failure is its
// master's, and Observe is not told which master that was, so marking all
// of DB0 down would fail the calls on the healthy masters too. A call on a
// key reports to ObserveKey, which marks that key's master down.
func (h *RedisHealth) Observe(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if h != nil && !h.PerMaster() && unreachable(err) {
		h.MarkDown()
	}
	return ClassifyRedisError(err)
}

// Ping checks Redis with one round trip (or fails at once while it is down),
// for request paths that must not proceed without DB0 but have no script of
// their own to run. The caller bounds ctx. On a Redis Cluster the PING goes
// to one master picked at random, whose failure is its own: it fails this
// call and marks nothing down (Observe); PingKey checks the master of a
// given key.
func (h *RedisHealth) Ping(ctx context.Context) error {
	if err := h.Check(); err != nil {
		return err
	}
	return h.Observe(h.c.Ping(ctx).Err())
}

// MarkDown flips the state to down and starts the prober.
func (h *RedisHealth) MarkDown() {
	if !h.down.CompareAndSwap(false, true) {
		return
	}
	h.logger.Warn("redis unreachable: failing fast until it answers again")
	h.report()
	h.prober.Start()
}

// report tells OnChange when Down flipped since it was last told.
func (h *RedisHealth) report() {
	down := h.Down()
	if h.reported.CompareAndSwap(!down, down) && h.cfg.OnChange != nil {
		h.cfg.OnChange(down)
	}
}

// probe PINGs what is down once (Redis, each master found unreachable) and
// marks up what answered; false, once nothing is down, ends the prober (a
// later MarkDown starts it again).
func (h *RedisHealth) probe(ctx context.Context) bool {
	if h.down.Load() && h.c.Ping(ctx).Err() == nil && h.down.CompareAndSwap(true, false) {
		h.logger.Info("redis reachable again")
	}
	h.probeMasters(ctx)
	h.report()
	return h.Down()
}

// Close stops the prober and waits for it. It is idempotent; the state
// stays as it was.
func (h *RedisHealth) Close() {
	if h == nil {
		return
	}
	h.prober.Close()
}

// unreachable reports whether err means no answer came from the server.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, redis.ErrPoolTimeout) || err == ErrRedisUnavailable {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "connection reset") ||
		strings.HasPrefix(msg, "LOADING") || strings.Contains(msg, "EOF") || strings.Contains(msg, "broken pipe")
}
