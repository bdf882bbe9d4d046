package settings

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// SnapshotTTL is the life of a shared snapshot in Redis (docs/redis-keys.md).
const SnapshotTTL = 5 * time.Minute

// MaxSnapshotBytes bounds a shared snapshot. An instance reads at most this
// much of the snapshot key (a larger value, planted or damaged, is ignored
// and replaced), and a version whose snapshot is larger is not shared: every
// instance reads it from PostgreSQL.
const MaxSnapshotBytes = 4 << 20

// SnapshotKey is han:settings:snapshot:<version>:<stamp> (DB1). The stamp
// is part of the name because a version number alone may name two states
// once PostgreSQL has gone back in time (see [Provider.Refresh]).
func SnapshotKey(version int64, stamp string) string {
	return "han:settings:snapshot:" + strconv.FormatInt(version, 10) + ":" + stamp
}

// Config configures a Provider.
type Config struct {
	// Scope names the group of instances that share snapshots: the id of
	// the refresh lock han:coord:lock:settings-refresh:{<scope>}. The
	// service uses HAN_ENV. Required; no braces, colons or spaces.
	Scope string
	// Secret signs the shared snapshots (a key derived from it): an
	// instance takes only a snapshot signed with it, so holding DB1's
	// credentials is not enough to put settings in force. The service uses
	// HAN_HMAC_SECRET. Required.
	Secret []byte
	// RefreshInterval is how often the version is checked: the bound on how
	// long a committed change takes to reach an instance. Zero value means
	// 5s.
	RefreshInterval time.Duration
	// PeerWait is how long an instance that finds the refresh lock taken
	// waits for the holder's snapshot before reading PostgreSQL itself.
	// Zero value means 1s.
	PeerWait time.Duration
	// RedisTimeout bounds each DB1 call. Zero value means 1s.
	RedisTimeout time.Duration
	// Base is the built-in policy table the overrides apply to. Zero value
	// means ratelimit.DefaultPolicies().
	Base *ratelimit.PolicySet
	// Logger: zero value means discard.
	Logger *slog.Logger
	// Registerer receives the metrics. Zero value means no metrics.
	Registerer prometheus.Registerer
	// OnPublish, when set, is called after this instance published a
	// snapshot to Redis (tests, tracing).
	OnPublish func(version int64)
}

// current is one applied version.
type current struct {
	head
	policies *ratelimit.PolicySet
	tunables map[string]json.RawMessage
}

// Provider serves the current settings and refreshes them.
type Provider struct {
	cfg    Config
	key    []byte // signs the shared snapshots (snapshotKeyFrom)
	store  *store.Store
	db1    redis.UniversalClient
	locker *rds.Locker
	logger *slog.Logger

	cur      atomic.Pointer[current]
	refresh  sync.Mutex // one refresh at a time per instance; guards rejected
	rejected head       // the last state refused as invalid (not retried)

	inLock func() // test hook: runs while the refresh lock is held

	refreshes *prometheus.CounterVec
	version   prometheus.Gauge

	loop *loop.Loop
}

var _ ratelimit.PolicyProvider = (*Provider)(nil)

// New builds a Provider serving cfg.Base (version 0) until the first
// Refresh; call Refresh once before serving, then Start.
func New(cfg Config, st *store.Store, db1 redis.UniversalClient) (*Provider, error) {
	if st == nil || db1 == nil {
		return nil, errors.New("settings: Store and DB1 client are required")
	}
	if cfg.Scope == "" {
		return nil, errors.New("settings: Scope is required")
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("settings: Secret is required")
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = 5 * time.Second
	}
	if cfg.PeerWait <= 0 {
		cfg.PeerWait = time.Second
	}
	if cfg.RedisTimeout <= 0 {
		cfg.RedisTimeout = time.Second
	}
	if cfg.Base == nil {
		cfg.Base = ratelimit.DefaultPolicies()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Provider{cfg: cfg, key: signingKey(cfg.Secret), store: st, db1: db1, locker: rds.NewLocker(db1), logger: cfg.Logger}
	p.loop = loop.New(loop.Config{Interval: cfg.RefreshInterval, Timeout: cfg.RefreshInterval + cfg.PeerWait + 5*time.Second},
		func(ctx context.Context) bool {
			_ = p.Refresh(ctx)
			return true
		})
	p.cur.Store(&current{policies: cfg.Base, tunables: map[string]json.RawMessage{}})
	p.refreshes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "han_settings_refreshes_total",
		Help: "Runtime settings refreshes that found a new version, by source (redis = shared snapshot, postgres_published, postgres) or failure (invalid, error).",
	}, []string{"result"})
	p.version = prometheus.NewGauge(prometheus.GaugeOpts{Name: "han_settings_version", Help: "The runtime settings version in force."})
	if cfg.Registerer != nil {
		var err error
		if p.refreshes, err = register(cfg.Registerer, p.refreshes); err != nil {
			return nil, err
		}
		if p.version, err = register(cfg.Registerer, p.version); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Policies is the current rate-limit policy set (ratelimit.PolicyProvider).
func (p *Provider) Policies() *ratelimit.PolicySet { return p.cur.Load().policies }

// Version is the settings version in force (0 before the first refresh).
func (p *Provider) Version() int64 { return p.cur.Load().version }

// Int returns tunable name as an integer, or def when it is absent, JSON
// null or not a JSON integer. A known tunable whose new value cannot be
// used keeps the value in force (see servedTunables).
func (p *Provider) Int(name string, def int) int {
	raw, ok := p.cur.Load().tunables[name]
	if !ok || isNull(raw) {
		return def
	}
	var v int
	if err := json.Unmarshal(raw, &v); err != nil {
		return def
	}
	return v
}

// Refresh brings the provider to the settings state PostgreSQL is at (one
// tick). On any failure the settings in force stay as they are.
//
// A state is its version and its stamp, and any state other than the one in
// force is applied, a lower or equal version included: PostgreSQL is the
// truth, and a version that is not higher than the one in force means it
// has gone back in time (a failover to a replica that had not received the
// last settings commit, a point-in-time restore), so the settings in force
// were lost with that history. Comparing numbers alone would keep them in
// force, and would take the next change, which reuses a lost number, for
// one already applied.
func (p *Provider) Refresh(ctx context.Context) error {
	p.refresh.Lock()
	defer p.refresh.Unlock()
	h, err := p.readHead(ctx)
	if err != nil {
		p.fail(ctx, "read version", err)
		return err
	}
	in := p.cur.Load().head
	if h == in || h == p.rejected {
		return nil
	}
	if in.version > 0 && h.version <= in.version {
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: PostgreSQL is at another history than the settings in force (failover or restore); applying its state",
			slog.Int64("version", h.version), slog.Int64("in_force", in.version))
	}
	if snap, set, ok := p.fetch(ctx, h); ok {
		return p.apply(ctx, snap, set, "redis")
	}
	lctx, cancel := context.WithTimeout(ctx, p.cfg.RedisTimeout)
	lk, _, err := p.locker.Acquire(lctx, rds.LockSettingsRefresh, p.cfg.Scope, rds.DefaultLockTTL)
	cancel()
	switch {
	case err == nil:
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.RedisTimeout)
			_ = lk.Release(rctx)
			cancel()
		}()
		if p.inLock != nil {
			p.inLock()
		}
		// The previous holder may have published it meanwhile.
		if snap, set, ok := p.fetch(ctx, h); ok {
			return p.apply(ctx, snap, set, "redis")
		}
		return p.loadAndApply(ctx, h, true)
	case errors.Is(err, rds.ErrLockHeld):
		if snap, set, ok := p.waitForPeer(ctx, h); ok {
			return p.apply(ctx, snap, set, "redis")
		}
	}
	// No snapshot from a peer, or DB1 unreachable: PostgreSQL is the truth.
	return p.loadAndApply(ctx, h, false)
}

// fetch reads the shared snapshot of state h and its policy set, if Redis
// holds a usable one. The snapshot is only a copy of PostgreSQL's rows: one
// that is not signed with this deployment's key (sign.go), is unreadable,
// names another state or does not make a valid policy set (planted, or
// damaged) is ignored, never taken for a refusal of the state, so the
// caller reads PostgreSQL and the lock holder replaces it.
func (p *Provider) fetch(ctx context.Context, h head) (Snapshot, *ratelimit.PolicySet, bool) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RedisTimeout)
	defer cancel()
	// GETRANGE, not GET: at most one byte past the bound is read. A missing
	// key reads as "".
	b, err := p.db1.GetRange(ctx, SnapshotKey(h.version, h.stamp), 0, MaxSnapshotBytes).Bytes()
	if err != nil {
		p.logger.LogAttrs(ctx, slog.LevelDebug, "settings: snapshot read failed", slog.String("kind", store.Kind(rds.ClassifyRedisError(err))))
		return Snapshot{}, nil, false
	}
	if len(b) == 0 {
		return Snapshot{}, nil, false
	}
	b, signed := p.opened(SnapshotKey(h.version, h.stamp), b)
	if !signed {
		// Not written by an instance of this deployment (planted, or
		// signed with another secret): nothing of it is trusted or logged.
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: ignoring a shared snapshot without this deployment's signature; reading PostgreSQL",
			slog.Int64("version", h.version))
		return Snapshot{}, nil, false
	}
	var s Snapshot
	if json.Unmarshal(b, &s) != nil || s.head() != h {
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: ignoring an unreadable shared snapshot", slog.Int64("version", h.version))
		return Snapshot{}, nil, false
	}
	set, err := s.PolicySet(p.cfg.Base)
	if err != nil {
		// Its content came from Redis, not from the rows: nothing of it is
		// logged (PostgreSQL's own refusal, if any, names the reason).
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: ignoring a shared snapshot that is not a valid version; reading PostgreSQL",
			slog.Int64("version", h.version))
		return Snapshot{}, nil, false
	}
	return s, set, true
}

// waitForPeer polls for the snapshot the lock holder is building.
func (p *Provider) waitForPeer(ctx context.Context, h head) (Snapshot, *ratelimit.PolicySet, bool) {
	deadline := time.Now().Add(p.cfg.PeerWait)
	t := time.NewTicker(max(p.cfg.PeerWait/20, 5*time.Millisecond))
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return Snapshot{}, nil, false
		case <-p.loop.Stopped():
			return Snapshot{}, nil, false
		case <-t.C:
		}
		if s, set, ok := p.fetch(ctx, h); ok {
			return s, set, true
		}
	}
	return Snapshot{}, nil, false
}

// loadAndApply reads PostgreSQL, from state h on, and applies the result;
// with publish (the lock holder) it also shares the snapshot in Redis for 5
// minutes.
func (p *Provider) loadAndApply(ctx context.Context, h head, publish bool) error {
	rows, h, err := p.loadRows(ctx, h)
	if err != nil {
		p.fail(ctx, "load", err)
		return err
	}
	snap, err := fromRows(rows, h.stamp)
	var set *ratelimit.PolicySet
	if err == nil {
		set, err = snap.PolicySet(p.cfg.Base)
	}
	if err != nil {
		return p.reject(ctx, h, err)
	}
	source := "postgres"
	if publish && p.publish(ctx, snap) {
		source = "postgres_published"
	}
	return p.apply(ctx, snap, set, source)
}

// publish shares snap in Redis for SnapshotTTL, signed; false when it is
// not shared (Redis failed, or the stored value is larger than
// MaxSnapshotBytes, which no instance would take).
func (p *Provider) publish(ctx context.Context, snap Snapshot) bool {
	b, err := json.Marshal(snap)
	if err != nil {
		return false
	}
	b = p.sealed(SnapshotKey(snap.Version, snap.Stamp), b)
	if len(b) > MaxSnapshotBytes {
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: snapshot too large to share; every instance reads PostgreSQL",
			slog.Int64("version", snap.Version), slog.Int("bytes", len(b)))
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, p.cfg.RedisTimeout)
	err = p.db1.Set(pctx, SnapshotKey(snap.Version, snap.Stamp), b, SnapshotTTL).Err()
	cancel()
	if err != nil {
		p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: snapshot not shared", slog.String("kind", store.Kind(rds.ClassifyRedisError(err))))
		return false
	}
	if p.cfg.OnPublish != nil {
		p.cfg.OnPublish(snap.Version)
	}
	return true
}

// apply swaps in a snapshot of the state PostgreSQL is at and its policy
// set (already validated), unless it is already in force. Its version may
// be lower than the one in force: see Refresh.
func (p *Provider) apply(ctx context.Context, s Snapshot, set *ratelimit.PolicySet, source string) error {
	in := p.cur.Load()
	if s.head() == in.head {
		return nil
	}
	tun := p.servedTunables(ctx, s.Version, s.Tunables, in.tunables)
	p.cur.Store(&current{head: s.head(), policies: set, tunables: tun})
	p.version.Set(float64(s.Version))
	p.refreshes.WithLabelValues(source).Inc()
	p.logger.LogAttrs(ctx, slog.LevelInfo, "settings: version applied", slog.Int64("version", s.Version), slog.String("source", source))
	return nil
}

// ErrInvalid wraps a settings version refused as a whole.
var ErrInvalid = errors.New("settings: invalid settings version")

func (p *Provider) reject(ctx context.Context, h head, cause error) error {
	p.rejected = h
	p.refreshes.WithLabelValues("invalid").Inc()
	// The cause names a route and a rule, never a secret: it is safe to log.
	p.logger.LogAttrs(ctx, slog.LevelError, "settings: version refused; previous settings stay in force",
		slog.Int64("version", h.version), slog.Int64("in_force", p.Version()), slog.String("reason", cause.Error()))
	return fmt.Errorf("%w %d: %w", ErrInvalid, h.version, cause)
}

func (p *Provider) fail(ctx context.Context, what string, err error) {
	p.refreshes.WithLabelValues("error").Inc()
	p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: refresh failed; previous settings stay in force",
		slog.String("step", what), slog.String("kind", store.Kind(err)))
}

// Start refreshes every RefreshInterval until Close.
func (p *Provider) Start() { p.loop.Start() }

// Close stops the refresh loop and waits for a refresh in progress.
// Idempotent.
func (p *Provider) Close() { p.loop.Close() }

// register registers c, or returns the collector already registered under
// its name (several providers on one registry).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return c, nil
	case errors.As(err, &are):
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("settings: register metrics: %w", err)
}
