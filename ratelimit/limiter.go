package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Mode chooses how the families of one request are evaluated in Redis.
type Mode int

const (
	// ModeAuto is ModeAtomic on a single Redis and ModePerFamily on a
	// Redis Cluster client.
	ModeAuto Mode = iota
	// ModeAtomic evaluates all families in one script (their keys must
	// live on one instance).
	ModeAtomic
	// ModePerFamily evaluates the families in turn with one single-key
	// script each and refunds the earlier admissions of a request that a
	// later family denies (keys in different Cluster slots).
	ModePerFamily
)

// Config configures a Limiter.
type Config struct {
	// Redis is DB0. A *redis.ClusterClient selects ModePerFamily under
	// ModeAuto. Required.
	Redis redis.Scripter
	// Policies is the policy provider. Zero value means DefaultPolicies.
	Policies PolicyProvider
	// Timeout is the Redis budget of one decision (including a refund).
	// Zero value means 1s.
	Timeout time.Duration
	// Mode: zero value means ModeAuto.
	Mode Mode
	// Health is the shared DB0 fast-failure state (rds.RedisHealth):
	// while it says Redis (on a cluster, a key's master) is down the
	// limiter skips Redis for the decisions on it, and it is told about
	// every failure with the key of the call that failed. Zero value means
	// the limiter's own breaker (see Cooldown).
	Health Health
	// Cooldown is how long the limiter's own breaker skips Redis after it
	// failed as unavailable; then one request at a time probes it. Unused
	// with Health. Zero value means 500ms.
	Cooldown time.Duration
	// LocalFraction is the share of a rule's limit the in-process fallback
	// grants per instance. Zero value means 0.25.
	LocalFraction float64
	// LocalMaxEntries caps the fallback's buckets. Zero value means 10000.
	LocalMaxEntries int
	// Registerer receives the metrics. Zero value means no metrics.
	Registerer prometheus.Registerer
	// Logger: zero value means discard.
	Logger *slog.Logger
	// OnDecision, when set, is called after every decision (tracing, tests).
	OnDecision func(label string, d Decision)
}

// Health is the fast-failure state of DB0, implemented by rds.RedisHealth.
// Every call names the key it is about: on a Redis Cluster a decision's
// failure is the failure of its key's master, which must fail fast only
// the decisions on that master's keys, never those on the healthy masters.
type Health interface {
	// CheckKey fails at once while Redis, or on a cluster key's master,
	// is considered unreachable.
	CheckKey(key string) error
	// ObserveKey classifies the error of a call on key and marks Redis (on
	// a cluster, key's master) down when it was not reached; it returns
	// the classified error.
	ObserveKey(key string, err error) error
}

// Subject names who a request is counted against; an empty field means the
// family does not apply to the request (e.g. no user on a public route).
type Subject struct {
	UserID   string
	IPHMAC   string
	DialogID string
	Service  string
}

func (s Subject) of(f Family) string {
	switch f {
	case FamilyUser:
		return s.UserID
	case FamilyIP:
		return s.IPHMAC
	case FamilyDialog:
		return s.DialogID
	case FamilyService:
		return s.Service
	}
	return ""
}

// Limiter evaluates policies against Redis, with the in-process fallback.
type Limiter struct {
	rdb       redis.Scripter
	scripts   rds.ScriptRunner // rdb's decision scripts, batched with concurrent requests'
	policies  PolicyProvider
	timeout   time.Duration
	perFamily bool
	cooldown  time.Duration
	health    Health
	local     *local
	logger    *slog.Logger
	observe   func(string, Decision)
	metrics   *metrics

	idPrefix string
	seq      atomic.Uint64
	whole    breaker  // Redis's (breaker.go)
	masters  sync.Map // on a Redis Cluster in per-family mode: master address → *breaker

	// unanswered holds the decisions whose call got no reply (unanswered.go).
	unanswered *rds.LateCalls[unanswered]
}

// New builds a Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Redis == nil {
		return nil, errors.New("ratelimit: Redis is required")
	}
	if cfg.Policies == nil {
		cfg.Policies = Static{DefaultPolicies()}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = 500 * time.Millisecond
	}
	if cfg.LocalFraction <= 0 || cfg.LocalFraction > 1 {
		cfg.LocalFraction = 0.25
	}
	if cfg.LocalMaxEntries <= 0 {
		cfg.LocalMaxEntries = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l := &Limiter{
		rdb: cfg.Redis, scripts: rds.Scripts(cfg.Redis), policies: cfg.Policies, timeout: cfg.Timeout, cooldown: cfg.Cooldown, health: cfg.Health,
		local: newLocal(cfg.LocalFraction, cfg.LocalMaxEntries), logger: cfg.Logger, observe: cfg.OnDecision,
		unanswered: &rds.LateCalls[unanswered]{Max: maxUnanswered, Every: unansweredEvery, Settle: unansweredSettle},
	}
	switch cfg.Mode {
	case ModePerFamily:
		l.perFamily = true
	case ModeAuto:
		_, l.perFamily = cfg.Redis.(*redis.ClusterClient)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	l.idPrefix = hex.EncodeToString(b) + "-"
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	return l, nil
}

// Policies returns the current policy snapshot.
func (l *Limiter) Policies() *PolicySet { return l.policies.Policies() }

// Decide evaluates policy p of route label for subject s. It returns a
// Decision (allowed or denied) or, when Redis cannot decide and the policy
// fails closed, one of rds.ErrRedisUnavailable, rds.ErrRedisOOM,
// rds.ErrExpiryDenied. A family whose subject s lacks is skipped, and a
// request left with no family is allowed with an empty Families list and
// touches nothing: that is what a policy without rules means (not limited).
// A policy with rules always counts its route's callers by some family, as
// NewPolicySet refuses one that does not (Callers).
func (l *Limiter) Decide(ctx context.Context, label string, p Policy, s Subject) (Decision, error) {
	keys, rules := l.subjectKeys(label, p, s)
	if len(rules) == 0 {
		return Decision{Allowed: true, NowMs: time.Now().UnixMilli()}, nil
	}
	if !l.perFamily {
		pr := l.prepared(label, p, keys, rules)
		return pr.Finish(pr.Send(ctx))
	}
	return l.decideFamilies(ctx, label, p, keys, rules)
}

// Keys are the Redis keys a decision of policy p of route label for
// subject s counts on, one per family that applies, in policy order (none
// when no family applies: such a decision touches nothing).
func (l *Limiter) Keys(label string, p Policy, s Subject) []string {
	keys, _ := l.subjectKeys(label, p, s)
	return keys
}

// subjectKeys are the keys and rules of p's families that apply to s.
func (l *Limiter) subjectKeys(label string, p Policy, s Subject) ([]string, []Rule) {
	rules := make([]Rule, 0, len(p.Rules))
	keys := make([]string, 0, len(p.Rules))
	var routeHash string
	for _, r := range p.Rules {
		subj := s.of(r.Family)
		if subj == "" {
			continue
		}
		if routeHash == "" {
			routeHash = RouteHash(label)
		}
		rules = append(rules, r)
		keys = append(keys, Key(r.Family, subj, routeHash, p.Algorithm, r.Window))
	}
	return keys, rules
}

// clientLeft reports a decision cut short because the client went away:
// Redis is not to blame and the breaker stays as it was.
func (l *Limiter) clientLeft(prober bool, err error) bool {
	if !errors.Is(err, context.Canceled) || errors.Is(err, rds.ErrRedisUnavailable) {
		return false
	}
	if prober {
		l.whole.probing.Store(false)
	}
	return true
}

// finish turns Redis's answer (d, or err) into the decision: the local
// fallback when Redis could not decide and the policy allows it, and the
// decision metrics.
func (l *Limiter) finish(label string, p Policy, keys []string, rules []Rule, d Decision, err error) (Decision, error) {
	if err != nil {
		if p.OnFailure != FallbackLocal {
			l.metrics.decision(label, "error")
			return Decision{}, err
		}
		d = l.local.decide(label, keys, rules, time.Now())
		if d.Allowed {
			l.metrics.decision(label, "fallback")
		} else {
			l.metrics.decision(label, "fallback_denied")
		}
	} else if d.Allowed {
		l.metrics.decision(label, "allowed")
	} else {
		l.metrics.decision(label, "denied")
	}
	if l.observe != nil {
		l.observe(label, d)
	}
	return d, nil
}

// Prepared is a decision whose one Redis call is not made yet, so the
// caller can send it in one pipeline with a call of its own (Call, then
// Finish with the reply). On a single Redis, Decide is exactly that.
type Prepared struct {
	l      *Limiter
	label  string
	p      Policy
	keys   []string
	rules  []Rule
	id     string          // the request id the call admits under
	call   *rds.ScriptCall // nil: decided without Redis (breaker open)
	prober bool
}

// Prepare readies the decision of policy p for subject s when it takes
// exactly one script call (a single Redis; on a Redis Cluster each family
// is its own call and Decide must be used) and at least one family
// applies; else it returns nil.
func (l *Limiter) Prepare(label string, p Policy, s Subject) *Prepared {
	if l.perFamily {
		return nil
	}
	keys, rules := l.subjectKeys(label, p, s)
	if len(rules) == 0 {
		return nil
	}
	return l.prepared(label, p, keys, rules)
}

// prepared is the one-call decision over keys and rules; it consults the
// breaker (a call is made only while Redis is usable).
func (l *Limiter) prepared(label string, p Policy, keys []string, rules []Rule) *Prepared {
	pr := &Prepared{l: l, label: label, p: p, keys: keys, rules: rules}
	if l.redisUsable(keys, &pr.prober) {
		l.refundUnanswered(keys)
		pr.id = l.requestID()
		pr.call = &rds.ScriptCall{Script: script(p.Algorithm), Keys: keys, Args: scriptArgs(pr.id, keys, rules)}
	}
	return pr
}

// Call is the script call to send (with the caller's calls, within the
// limiter's Timeout), or nil when there is nothing to send.
func (pr *Prepared) Call() *rds.ScriptCall { return pr.call }

// Timeout is the Redis budget of the decision.
func (pr *Prepared) Timeout() time.Duration { return pr.l.timeout }

// Send makes Call alone, within Timeout: the decision then needs Finish
// with the reply. Nil when Call is nil.
func (pr *Prepared) Send(ctx context.Context) *redis.Cmd {
	if pr.call == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, pr.l.timeout)
	defer cancel()
	return pr.l.scripts.Script(ctx, pr.call.Script, pr.call.Keys, pr.call.Args...)
}

// Finish decides from the reply of Call (nil when Call was nil), as Decide
// would have.
func (pr *Prepared) Finish(reply *redis.Cmd) (Decision, error) {
	l := pr.l
	var d Decision
	err := rds.ErrRedisUnavailable
	if pr.call != nil {
		d, err = decision(reply, pr.p.Algorithm, pr.id, pr.keys, pr.rules)
		if err != nil && reply != nil && rds.Unanswered(reply.Err()) {
			l.rememberUnanswered(pr.p, pr.id, pr.keys, pr.rules)
		}
		if l.clientLeft(pr.prober, err) {
			return Decision{}, err
		}
		l.redisDone(pr.keys, pr.prober, err)
	}
	return l.finish(pr.label, pr.p, pr.keys, pr.rules, d, err)
}

// redisUsable reports whether to ask Redis for a decision over keys (all on
// one Redis instance): always while it is up; after an outage only once the
// cooldown passed, and then for one prober at a time (or whatever the
// shared Health says of keys' instance).
func (l *Limiter) redisUsable(keys []string, prober *bool) bool {
	if l.health != nil {
		return l.health.CheckKey(keys[0]) == nil
	}
	return l.whole.usable(prober)
}

// redisDone records the outcome of a Redis evaluation over keys (all on one
// Redis instance) in the breaker.
func (l *Limiter) redisDone(keys []string, prober bool, err error) {
	if l.health != nil {
		if err != nil {
			l.health.ObserveKey(keys[0], err)
		}
		return
	}
	if prober {
		l.whole.probing.Store(false)
	}
	l.whole.record(err, l.cooldown)
}

func script(a Algorithm) *lua.Script {
	switch a {
	case FixedWindow:
		return lua.RateLimitFixed
	case TokenBucket:
		return lua.RateLimitBucket
	}
	return lua.RateLimitSliding
}

func (l *Limiter) requestID() string {
	return l.idPrefix + strconv.FormatUint(l.seq.Add(1), 36)
}

// evalRedis runs p's script per family with refunds (keys in different
// Cluster slots); a call that gets no reply leaves the families it may have
// admitted to rememberUnanswered. answered is how many families Redis
// answered (the first failure, or a denial, ends the evaluation).
func (l *Limiter) evalRedis(ctx context.Context, p Policy, keys []string, rules []Rule) (Decision, int, error) {
	a := p.Algorithm
	id := l.requestID()
	if len(keys) == 1 {
		d, err := l.runFamily(ctx, p, id, keys, rules, 0)
		if err != nil {
			return d, 0, err
		}
		return d, 1, nil
	}
	answered := 0
	ds := make([]Decision, 0, len(keys))
	for i := range keys {
		d, err := l.runFamily(ctx, p, id, keys, rules, i)
		if err == nil {
			answered++
		}
		if err == nil && d.Allowed {
			ds = append(ds, d)
			continue
		}
		// Denied (or failed): give back what this request took so far.
		for j := len(ds) - 1; j >= 0; j-- {
			l.refund(ctx, a, id, keys[j], rules[j], ds[j].ResetAtMs, "ok")
		}
		if err != nil {
			return Decision{}, answered, err
		}
		// Families after the denying one were not evaluated; report the
		// earlier ones as they are after the refund (one more remaining).
		out := d
		out.Families = make([]FamilyDecision, 0, i+1)
		for j := range ds {
			f := ds[j].Families[0]
			f.Remaining++
			out.Families = append(out.Families, f)
			out.Remaining = min(out.Remaining, f.Remaining)
		}
		out.Families = append(out.Families, d.Families[0])
		return out, answered, nil
	}
	out := Decision{Allowed: true, Remaining: -1, NowMs: ds[len(ds)-1].NowMs, id: id, algo: a}
	for _, d := range ds {
		f := d.Families[0]
		out.Families = append(out.Families, f)
		if out.Remaining < 0 || f.Remaining < out.Remaining || (f.Remaining == out.Remaining && f.ResetAtMs > out.ResetAtMs) {
			out.Remaining, out.ResetAtMs = f.Remaining, f.ResetAtMs
		}
	}
	return out, answered, nil
}

// runFamily runs p's script for family i of keys alone.
func (l *Limiter) runFamily(ctx context.Context, p Policy, id string, keys []string, rules []Rule, i int) (Decision, error) {
	reply := l.scripts.Script(ctx, script(p.Algorithm), keys[i:i+1], scriptArgs(id, keys[i:i+1], rules[i:i+1])...)
	d, err := decision(reply, p.Algorithm, id, keys[i:i+1], rules[i:i+1])
	if err != nil && rds.Unanswered(reply.Err()) {
		// Families 0..i may all hold an admission: the earlier ones'
		// refunds will likely get no reply either.
		l.rememberUnanswered(p, id, keys[:i+1], rules[:i+1])
	}
	return d, err
}

// refund gives back request id's admission on key and counts it as result
// ("failed" when the refund script did not run).
func (l *Limiter) refund(ctx context.Context, a Algorithm, id, key string, r Rule, resetAt int64, result string) {
	// The refund must happen even if the client hangs up now.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	err := lua.RateLimitRefund.Run(ctx, l.rdb, []string{key}, string(a), id,
		r.Window.Milliseconds(), Jitter(key, r.Window), resetAt, r.Limit).Err()
	if err != nil {
		// The over-count heals when the window passes; it only ever makes
		// the limit stricter.
		l.metrics.refund("failed")
		l.logger.Warn("rate-limit refund failed", slog.String("family", string(r.Family)),
			slog.String("kind", fmt.Sprintf("%T", rds.ClassifyRedisError(err))))
		return
	}
	l.metrics.refund(result)
}

// Refund gives back the admission allowed decision d made on family f, and
// only that one: the request's other families stay charged. It is for a
// request answered without reaching what f protects, which must not spend
// f's budget — a message send that put no message into the dialog (refused,
// its sender no member, or a replay) must not use up the dialog's limit, or
// outsiders could silence the dialog while their own user limit still pays
// for each try.
// Every algorithm gives back exactly this admission: the sliding log removes
// the request's own entry; the fixed window decrements the counter of the
// window the admission was counted in, and does nothing once that window
// has ended (the admission left with it); the token bucket credits one
// token back, capped at capacity (it can only return the refill the bucket
// would have lost at capacity meanwhile, ≤ 1 token). result is the
// han_ratelimit_refunds_total label of a refund that ran (a constant of the
// caller's, so the label stays bounded). A denial, a local
// decision (nothing of it is in Redis) or a decision without family f has
// nothing to give back.
func (l *Limiter) Refund(ctx context.Context, d Decision, f Family, result string) {
	if !d.Allowed || d.id == "" {
		return
	}
	for _, fd := range d.Families {
		if fd.Rule.Family == f && fd.key != "" {
			l.refund(ctx, d.algo, d.id, fd.key, fd.Rule, fd.ResetAtMs, result)
		}
	}
}

// DecideLocal is the in-process fallback's decision of policy p for subject
// s, as if p fell back to it (counted fallback / fallback_denied). It is for
// a caller that still serves a request whose Decide failed on a fail-closed
// policy — restapi answers such a message send or attachment init from a
// completed PostgreSQL record, which costs a PostgreSQL lookup per request
// — so that request is still bounded, by the share of its limits a
// fallback-local route keeps.
func (l *Limiter) DecideLocal(label string, p Policy, s Subject) Decision {
	keys, rules := l.subjectKeys(label, p, s)
	if len(rules) == 0 {
		return Decision{Allowed: true, NowMs: time.Now().UnixMilli()}
	}
	p.OnFailure = FallbackLocal
	d, _ := l.finish(label, p, keys, rules, Decision{}, rds.ErrRedisUnavailable)
	return d
}

// Eval runs algorithm a's script once over keys (one rule per key) with
// request id id: the building block of Decide. Production goes through
// Decide; Eval is kept exported because the script-level tests and
// BenchmarkDecision call it with keys of their own.
func Eval(ctx context.Context, c redis.Scripter, a Algorithm, id string, keys []string, rules []Rule) (Decision, error) {
	return decision(script(a).Run(ctx, c, keys, scriptArgs(id, keys, rules)...), a, id, keys, rules)
}

// scriptArgs are the decision script's arguments: the request id, then
// limit, window and jitter of each rule.
func scriptArgs(id string, keys []string, rules []Rule) []any {
	args := make([]any, 0, 1+3*len(keys))
	args = append(args, id)
	for i, r := range rules {
		args = append(args, r.Limit, r.Window.Milliseconds(), Jitter(keys[i], r.Window))
	}
	return args
}

// decision parses the reply of the decision script that request id ran.
func decision(reply *redis.Cmd, a Algorithm, id string, keys []string, rules []Rule) (Decision, error) {
	v, err := reply.Int64Slice()
	if err != nil {
		return Decision{}, rds.ClassifyRedisError(err)
	}
	if len(v) != 5+2*len(keys) {
		return Decision{}, fmt.Errorf("ratelimit: script %s returned %d values: %w", a, len(v), rds.ErrRedisUnavailable)
	}
	d := Decision{Allowed: v[0] == 1, Remaining: v[1], RetryAfterMs: v[2], ResetAtMs: v[3], NowMs: v[4],
		Families: make([]FamilyDecision, len(keys)), id: id, algo: a}
	for i := range keys {
		d.Families[i] = FamilyDecision{Rule: rules[i], Remaining: v[5+2*i], ResetAtMs: v[6+2*i], key: keys[i]}
	}
	return d, nil
}
