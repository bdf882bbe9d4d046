package legacystub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// Safety states as clients see them: the message DTO's "safety" field and
// the safety endpoint's answer.
const (
	SafetyPending  = "pending"
	SafetyApproved = store.VerdictApproved
	SafetyRejected = store.VerdictRejected
)

// TunableVerdictAfterPolls is the runtime setting (runtime_settings row)
// that overrides Config.VerdictAfterPolls without a restart.
const TunableVerdictAfterPolls = "legacy_stub.verdict_after_polls"

// Config tunes the stub. The defaults (2 s × 30 polls + 120 s recovery, a
// 180 s task TTL) are those of docs/legacy-stub.md.
type Config struct {
	// PollInterval is how often a client is expected to poll. Zero value
	// means 2s.
	PollInterval time.Duration
	// MaxPolls is how many polls a client makes at most. Zero value means 30.
	MaxPolls int
	// RecoveryBudget is how long recovery of a task whose poll budget ran
	// out may take. Zero value means 120s.
	RecoveryBudget time.Duration
	// TaskTTL is the TTL of the task in DB2. Zero value means
	// PollInterval × MaxPolls + RecoveryBudget (180 s).
	TaskTTL time.Duration
	// VerdictAfterPolls is the poll that decides the verdict. Zero value
	// means 3.
	VerdictAfterPolls int
	// RecoveryInterval is the Recoverer's period. Zero value means 10s.
	RecoveryInterval time.Duration
	// RecoveryLease is the PostgreSQL lease (and Redis lock TTL) of one
	// task's recovery. Zero value means 30s.
	RecoveryLease time.Duration
	// RedisTimeout bounds each DB2 call. Zero value means 1s.
	RedisTimeout time.Duration
	// CreateCooldown is how long Start skips DB2 after a task write found
	// it unreachable (refused or timed out); then one Start at a time tries
	// it again. Zero value means 5s.
	CreateCooldown time.Duration
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.PollInterval, 2*time.Second)
	def(&c.RecoveryBudget, 120*time.Second)
	def(&c.RecoveryInterval, 10*time.Second)
	def(&c.RecoveryLease, 30*time.Second)
	def(&c.RedisTimeout, time.Second)
	def(&c.CreateCooldown, 5*time.Second)
	if c.MaxPolls == 0 {
		c.MaxPolls = 30
	}
	if c.VerdictAfterPolls == 0 {
		c.VerdictAfterPolls = 3
	}
	def(&c.TaskTTL, c.PollBudget()+c.RecoveryBudget)
	return c
}

// PollBudget is PollInterval × MaxPolls: how long clients poll a task.
// A task still pending after it is stuck and goes to recovery.
func (c Config) PollBudget() time.Duration { return c.PollInterval * time.Duration(c.MaxPolls) }

// ErrConfig wraps every configuration refusal.
var ErrConfig = errors.New("legacystub: invalid configuration")

// Validate applies the defaults and checks the rules that keep a task alive
// as long as anyone may need it (the task TTL must exceed the poll/recovery
// budget):
//
//   - TaskTTL ≥ PollInterval × MaxPolls + RecoveryBudget;
//   - RecoveryInterval + RecoveryLease < RecoveryBudget, so a stuck task is
//     picked up and decided strictly inside the recovery budget, hence
//     strictly before its TTL runs out;
//   - VerdictAfterPolls ≤ MaxPolls, so a client polling as told sees a
//     verdict.
//
// Errors name the environment variables of internal/config.
func (c Config) Validate() (Config, error) {
	c = c.withDefaults()
	switch {
	case c.PollInterval < time.Millisecond || c.MaxPolls < 1 || c.RecoveryBudget <= 0 || c.TaskTTL <= 0 ||
		c.VerdictAfterPolls < 1 || c.RecoveryInterval <= 0 || c.RecoveryLease < time.Second:
		return c, fmt.Errorf("%w: HAN_LEGACY_STUB_POLL_INTERVAL, HAN_LEGACY_STUB_MAX_POLLS, HAN_LEGACY_STUB_RECOVERY_BUDGET and HAN_LEGACY_STUB_TASK_TTL must be positive", ErrConfig)
	case c.MaxPolls > int(math.MaxInt64/int64(c.PollInterval)) || c.PollBudget() > math.MaxInt64-c.RecoveryBudget:
		// PollInterval × MaxPolls (+ RecoveryBudget) would wrap past what a
		// duration holds, and a negative budget passes the check below.
		return c, fmt.Errorf("%w: HAN_LEGACY_STUB_POLL_INTERVAL × HAN_LEGACY_STUB_MAX_POLLS + HAN_LEGACY_STUB_RECOVERY_BUDGET is too long", ErrConfig)
	case c.TaskTTL < c.PollBudget()+c.RecoveryBudget:
		return c, fmt.Errorf("%w: HAN_LEGACY_STUB_TASK_TTL must cover HAN_LEGACY_STUB_POLL_INTERVAL × HAN_LEGACY_STUB_MAX_POLLS + HAN_LEGACY_STUB_RECOVERY_BUDGET", ErrConfig)
	case c.RecoveryInterval+c.RecoveryLease >= c.RecoveryBudget:
		return c, fmt.Errorf("%w: HAN_LEGACY_STUB_RECOVERY_BUDGET must exceed the recovery interval plus lease (%s)", ErrConfig, c.RecoveryInterval+c.RecoveryLease)
	case c.VerdictAfterPolls > c.MaxPolls:
		return c, fmt.Errorf("%w: the verdict must come within HAN_LEGACY_STUB_MAX_POLLS polls", ErrConfig)
	}
	return c, nil
}

// Tunables reads runtime settings (implemented by settings.Provider).
type Tunables interface {
	Int(name string, def int) int
}

// Deps are the stub's collaborators.
type Deps struct {
	// DB2 is the HAN_LEGACY_STUB_URL client (ACL user legacy_stub). Required.
	DB2   redis.UniversalClient
	Store *store.Store // required
	// Tunables, when set, may override VerdictAfterPolls at run time.
	Tunables   Tunables
	Logger     *slog.Logger          // zero value means discard
	Registerer prometheus.Registerer // zero value means no metrics
}

// Stub creates and polls safety tasks.
type Stub struct {
	cfg      Config
	db2      redis.UniversalClient
	store    *store.Store
	tunables Tunables
	logger   *slog.Logger
	events   *prometheus.CounterVec

	// Start's breaker, as the rate limiter's own: a stalled DB2 must not
	// hold every send for RedisTimeout.
	downUntil atomic.Int64 // unix ns until which Start skips DB2; 0: up
	probing   atomic.Bool  // one Start tries DB2 after the cooldown
}

// New validates cfg (refusing a task TTL that does not cover the budgets)
// and builds the stub.
func New(cfg Config, d Deps) (*Stub, error) {
	cfg, err := cfg.Validate()
	if err != nil {
		return nil, err
	}
	if d.DB2 == nil || d.Store == nil {
		return nil, errors.New("legacystub: DB2 client and Store are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stub{cfg: cfg, db2: d.DB2, store: d.Store, tunables: d.Tunables, logger: d.Logger}
	s.events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "han_legacy_stub_tasks_total",
		Help: "Legacy safety stub task events: created, create_failed, create_skipped, decided_poll, recovered, recovery_failed.",
	}, []string{"event"})
	if d.Registerer != nil {
		if err := d.Registerer.Register(s.events); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			s.events = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return s, nil
}

// Config is the validated configuration.
func (s *Stub) Config() Config { return s.cfg }

// Start writes the task into DB2 after the send committed. A failure is
// logged and counted, not returned to the client: the row stays pending and
// the Recoverer decides it once the poll budget has passed.
//
// Start runs before the send answers, so after a write that found DB2
// unreachable it skips DB2 for CreateCooldown (counted as create_skipped)
// and then lets one Start at a time try it again: a stalled DB2 holds one
// send for RedisTimeout now and then instead of every send. Skipping loses
// nothing: the stub_tasks row committed with the message is what recovery
// lists, and a task missing from DB2 polls as pending until recovery
// decides it.
func (s *Stub) Start(ctx context.Context, messageID string) {
	var prober bool
	if !s.db2Usable(&prober) {
		s.events.WithLabelValues("create_skipped").Inc()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
	defer cancel()
	_, err := store.CreateStubTask(ctx, s.db2, messageID, s.cfg.TaskTTL)
	s.db2Done(prober, err)
	if err != nil {
		s.events.WithLabelValues("create_failed").Inc()
		s.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: task not created in DB2; left to recovery",
			slog.String("message_id", messageID), slog.String("kind", store.Kind(err)))
		return
	}
	s.events.WithLabelValues("created").Inc()
}

// db2Usable reports whether Start should write to DB2: always while it is
// up; after it was found unreachable only once the cooldown passed, and
// then for one prober at a time.
func (s *Stub) db2Usable(prober *bool) bool {
	until := s.downUntil.Load()
	if until == 0 {
		return true
	}
	if time.Now().UnixNano() < until {
		return false
	}
	if s.probing.CompareAndSwap(false, true) {
		*prober = true
		return true
	}
	return false
}

// db2Done records the outcome of a task write in Start's breaker. Only
// unreachability opens it: an answer such as OOM or expiry_denied comes from
// a live server, and the next send tries again.
func (s *Stub) db2Done(prober bool, err error) {
	if prober {
		defer s.probing.Store(false)
	}
	if errors.Is(err, rds.ErrRedisUnavailable) {
		s.downUntil.Store(time.Now().Add(s.cfg.CreateCooldown).UnixNano())
	} else {
		// Written, or answered by a live DB2 (OOM, expiry_denied): closed.
		s.downUntil.Store(0)
	}
}

// HasTask reports whether a message has a safety task.
func (s *Stub) HasTask(ctx context.Context, messageID string) (bool, error) {
	_, err := s.store.StubTask(ctx, messageID)
	switch {
	case errors.Is(err, store.ErrStubTaskNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// Poll is one client poll: SafetyPending, SafetyApproved or SafetyRejected.
// A decided task answers from PostgreSQL (it outlives DB2); a pending one
// is polled in DB2 (get + increment), and the verdict a poll reaches is
// recorded in PostgreSQL, where the first decision wins. A task DB2 lost
// stays pending until recovery decides it. store.ErrStubTaskNotFound when
// the message has no task; Redis failures come back classified.
func (s *Stub) Poll(ctx context.Context, messageID string) (string, error) {
	t, err := s.store.StubTask(ctx, messageID)
	if err != nil {
		return "", err
	}
	if t.State == store.StubDone {
		return t.Verdict, nil
	}
	after := s.cfg.VerdictAfterPolls
	if s.tunables != nil {
		if v := s.tunables.Int(TunableVerdictAfterPolls, after); v >= 1 && v <= s.cfg.MaxPolls {
			after = v
		}
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	st, found, err := store.PollStubTask(rctx, s.db2, messageID, after, randomVerdict())
	cancel()
	if err != nil {
		return "", err
	}
	if !found || st.State != store.StubDone {
		return SafetyPending, nil
	}
	d, decided, err := s.store.DecideStubTask(ctx, messageID, st.Verdict)
	if err != nil {
		return "", err
	}
	if decided {
		s.events.WithLabelValues("decided_poll").Inc()
	}
	return d.Verdict, nil
}

func randomVerdict() string {
	if rand.IntN(2) == 0 {
		return store.VerdictApproved
	}
	return store.VerdictRejected
}
