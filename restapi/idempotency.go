package restapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// IdempotencyConfig tunes idempotency keys and the DB0 fast-failure budget.
type IdempotencyConfig struct {
	// RecordTTL is the life of a completed record in Redis and PostgreSQL.
	// Zero value means 24h.
	RecordTTL time.Duration
	// LockTTL is the in-progress lock's life between heartbeats (the
	// handler extends it every LockTTL/3). Zero value means 30s.
	LockTTL time.Duration
	// RedisBudget is the most a request waits on DB0 for one idempotency
	// step before failing closed. Zero value means 1s.
	RedisBudget time.Duration
	// ProbeInterval is the DB0 health prober's period while Redis is down.
	// Zero value means 250ms. Used only when Deps.RedisHealth is nil.
	ProbeInterval time.Duration
	// InstanceID is this instance's id in presence liveness
	// (han:rt:instance:{<id>} in DB1). A lock names the instance of its
	// owner, so a request that meets the lock of a dead instance takes it
	// over at once instead of waiting out LockTTL. Empty: this server's
	// locks name no instance and are never taken over.
	InstanceID string
	// Linger is how long a request's idempotency script (with the rate-limit
	// decision it carries) that finds the shared Redis pipeline free waits
	// for other requests' scripts to join it. Zero value: sent at once.
	Linger time.Duration
}

// Idempotency scopes: one per idempotent operation (part of the key).
const (
	scopeMessageSend    = "msg_send"
	scopeAttachmentInit = "att_init"
	scopeDialogCreate   = "dlg_create"
)

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted (1..255
// printable ASCII characters).
const MaxIdempotencyKeyLen = 255

var (
	errIdemKeyRequired = apiErr(http.StatusBadRequest, "idempotency_key_required")
	errIdemKeyInvalid  = apiErr(http.StatusBadRequest, "invalid_idempotency_key")
	errIdemKeyReused   = apiErr(http.StatusConflict, "idempotency_key_reused")
	errIdemInProgress  = apierr.NewRetry(http.StatusConflict, "idempotency_in_progress", 1)
)

const (
	idemReplayedHeader = "Idempotent-Replayed"
	// idemKeyHMACDomain separates idempotency-key HMACs from the IP HMACs
	// made with the same HAN_HMAC_SECRET.
	idemKeyHMACDomain = "han idempotency key v1\x00"
)

// Outcome labels of han_idempotency_requests_total.
const (
	idemOutcomeCreated   = "created"
	idemOutcomeReplay    = "replay"
	idemOutcomeReplayPG  = "replay_pg"
	idemOutcomeConflict  = "conflict"
	idemOutcomeBusy      = "in_progress"
	idemOutcomeFailed    = "failed"
	idemOutcomeFailClose = "fail_closed"
)

// idempotency is the server's idempotency machinery.
type idempotency struct {
	store       *store.Idempotency // nil without a DB0 client: every keyed request fails closed
	health      *rds.RedisHealth
	ownHealth   bool // created by NewServer, closed by Server.Close
	cfg         IdempotencyConfig
	keyOptional bool // benchmarks only: sends without a key run unprotected
	// stage, when set (tests only), is called with "locked" once the request
	// holds the lock, before its transaction, and "committed" after the
	// transaction committed, before the lock completes: the points where a
	// crash of the instance leaves a lock behind.
	stage     func(name string)
	requests  *prometheus.CounterVec
	abandoned *prometheus.CounterVec
	degraded  prometheus.Gauge
}

func (s *Server) initIdempotency(d Deps) {
	cfg := d.Config.Idempotency
	if cfg.RecordTTL <= 0 {
		cfg.RecordTTL = 24 * time.Hour
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 30 * time.Second
	}
	if cfg.RedisBudget <= 0 {
		cfg.RedisBudget = time.Second
	}
	id := &idempotency{cfg: cfg, health: d.RedisHealth}
	id.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "han_idempotency_requests_total",
		Help: "Idempotent requests by scope and outcome (created, replay, replay_pg = answered from PostgreSQL, conflict, in_progress, failed, fail_closed).",
	}, []string{"scope", "outcome"})
	id.abandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "han_idempotency_abandoned_total",
		Help: "Lock owner tokens of idempotency calls that got no reply from DB0, given up once it answered, by outcome (released = the call had taken the lock, marked = a late copy will take nothing, expired = DB0 did not answer within the lock TTL, dropped = queue full or shutdown).",
	}, []string{"outcome"})
	id.degraded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "han_redis_db0_degraded", Help: "1 while DB0 is considered unreachable and DB0-dependent requests fail fast.",
	})
	id.requests = registerOrReuse(s.metrics.Registry, id.requests)
	id.abandoned = registerOrReuse(s.metrics.Registry, id.abandoned)
	id.degraded = registerOrReuse(s.metrics.Registry, id.degraded)
	if id.health == nil && d.Redis != nil {
		id.health = rds.NewRedisHealth(d.Redis, rds.HealthConfig{
			ProbeInterval: cfg.ProbeInterval,
			ProbeTimeout:  cfg.RedisBudget,
			OnChange: func(down bool) {
				if down {
					id.degraded.Set(1)
				} else {
					id.degraded.Set(0)
				}
			},
		}, s.logger)
		id.ownHealth = true
	}
	if d.Redis != nil {
		id.store = store.NewIdempotency(d.Redis, id.health, store.IdempotencyConfig{RecordTTL: cfg.RecordTTL, LockTTL: cfg.LockTTL, Linger: cfg.Linger,
			OnAbandon: func(outcome string, n int) { id.abandoned.WithLabelValues(outcome).Add(float64(n)) }})
	}
	s.idem = id
}

// registerOrReuse registers c, or returns the collector already registered
// under its name (several servers sharing one Metrics).
func registerOrReuse[T prometheus.Collector](reg *prometheus.Registry, c T) T {
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(c); errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing
		}
	}
	return c
}

// Close stops the server's background work (the DB0 health prober it
// created) and marks the outbox rows it published delivered (call it after
// the last request ended, before the PostgreSQL pool closes). It is
// idempotent; the caller closes what it passed in Deps.
func (s *Server) Close() { s.Shutdown(context.Background()) }

// Shutdown is Close with the delivered marks bounded by ctx as well as by
// their own budget: marks it cuts leave their rows for the outbox relay.
func (s *Server) Shutdown(ctx context.Context) {
	if s.idem != nil && s.idem.store != nil {
		s.idem.store.Close() // the completes still queued
	}
	s.marker.Shutdown(ctx)
	if s.idem != nil && s.idem.ownHealth {
		s.idem.health.Close()
	}
}

// RedisHealth is the DB0 fast-failure state the server uses.
func (s *Server) RedisHealth() *rds.RedisHealth { return s.idem.health }

// idemKeyHeader reads Idempotency-Key: 1..255 printable ASCII characters
// (space included), one header line.
func idemKeyHeader(r *http.Request) (key string, present bool, err error) {
	vals := r.Header.Values("Idempotency-Key")
	switch {
	case len(vals) == 0 || len(vals) == 1 && vals[0] == "":
		return "", false, nil
	case len(vals) > 1:
		return "", false, errIdemKeyInvalid
	}
	key = vals[0]
	if len(key) > MaxIdempotencyKeyLen {
		return "", false, errIdemKeyInvalid
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", false, errIdemKeyInvalid
		}
	}
	return key, true, nil
}

// idemFingerprint hashes what makes two requests "the same": method, route
// template, the path's variables and the canonical body (the validated
// request re-encoded, so spacing and key order do not matter). The path's
// {id} is a UUID the handlers accept in either letter case, so it is
// hashed in its canonical form.
func idemFingerprint(r *http.Request, canon []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method + "\n" + RouteTemplate(r) + "\n"))
	vars := mux.Vars(r)
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := vars[k]
		if k == "id" {
			if c, ok := ids.Canonical(v); ok {
				v = c
			}
		}
		h.Write([]byte(k + "=" + v + "\n"))
	}
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil))
}

// idemResult is what an operation's first execution produced.
type idemResult struct {
	rec  store.IdemRecord // Status, ResourceID, Version, Meta of the outcome
	body []byte           // the response body
	// after runs once the transaction committed, before the response is
	// written (publishing the realtime event).
	after func()
}

// idemTarget names the durable record of a request with a key; the store
// writes it in the business transaction (idemWrite).
type idemTarget struct {
	key store.IdemKey
	fp  string
	ttl time.Duration
}

// idemWrite is the durable record t asks for, its outcome derived from the
// entity the business transaction wrote by record; nil when the request
// has no key.
func idemWrite[T any](t *idemTarget, record func(T) store.IdemRecord) *store.IdemWrite[T] {
	if t == nil {
		return nil
	}
	return &store.IdemWrite[T]{Key: t.key, Fingerprint: t.fp, TTL: t.ttl, Record: record}
}

// idemOp describes one idempotent operation.
type idemOp struct {
	scope    string
	required bool   // a missing key is 400 idempotency_key_required
	canon    []byte // canonical request
	// exec performs the business effect; with a non-nil target it has the
	// store write that record in the same transaction (idemWrite).
	exec func(ctx context.Context, target *idemTarget) (idemResult, error)
	// render rebuilds the response body of a completed record from the
	// resource it names (re-signing URLs deterministically).
	render func(ctx context.Context, rec store.IdemRecord) ([]byte, error)
}

// serveIdempotent runs op under the request's Idempotency-Key
// (docs/idempotency.md):
// reserve/compare/lock in one Lua script, the durable record written in the
// business transaction, owner-only complete/release, a lock heartbeat while
// the handler runs, byte-identical replays. A request that meets another
// owner's lock replays a committed PostgreSQL record, or takes over the lock
// of a dead instance (idemTakeOver). When DB0 is unreachable or out
// of memory it answers from a completed PostgreSQL record, or fails closed
// (docs/degraded-mode.md). Only successes are stored: every failure gives the key
// back, so a retry runs again.
func (s *Server) serveIdempotent(w http.ResponseWriter, r *http.Request, op idemOp) {
	key, present, err := idemKeyHeader(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !present {
		s.serveUnkeyed(w, r, op)
		return
	}
	k := store.IdemKey{Scope: op.scope, UserID: principal(r).UserID, KeyHMAC: HMACHex(s.hmacSecret, idemKeyHMACDomain+key)}
	fp := idemFingerprint(r, op.canon)
	owner, acquired := s.idemReserve(w, r, op, k, fp)
	if acquired {
		s.idemRun(w, r, op, k, fp, owner)
	}
}

// serveUnkeyed runs op for a request without an Idempotency-Key: refused
// where the key is required, else run once with nothing recorded.
func (s *Server) serveUnkeyed(w http.ResponseWriter, r *http.Request, op idemOp) {
	if !settlePendingLimit(w, r) {
		return
	}
	if op.required && !s.idem.keyOptional {
		s.fail(w, r, errIdemKeyRequired)
		return
	}
	res, err := op.exec(r.Context(), nil)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if res.after != nil {
		res.after()
	}
	writeRawJSON(w, res.rec.Status, res.body)
}

// idemReserve is the reserve phase: it takes the key's lock for a fresh
// owner and reports the owner and true, or answers the request itself
// (replay, conflict, in progress, or the fallback when DB0 cannot be used)
// and reports false.
func (s *Server) idemReserve(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp string) (string, bool) {
	ctx := r.Context()
	pl := takeLimit(ctx)
	if pl != nil && s.idem.store != nil && pl.paired() {
		return s.idemReserveWithLimit(w, r, op, k, fp, pl)
	}
	if pl != nil && !pl.settle(ctx) {
		return "", false
	}
	if s.idem.store == nil {
		s.idemFallback(w, r, op, k, fp, rds.ErrRedisUnavailable)
		return "", false
	}
	if err := deferredDB0(ctx); err != nil {
		// The limit could not be applied: no new effect, only a replay.
		s.idemFallback(w, r, op, k, fp, err)
		return "", false
	}
	owner := s.idemOwner()
	rctx, cancel := context.WithTimeout(ctx, s.idem.cfg.RedisBudget)
	res, err := s.idem.store.Reserve(rctx, k, fp, owner)
	cancel()
	return s.idemReserved(w, r, op, k, fp, owner, res, err)
}

// idemReserveWithLimit is idemReserve with the request's pending rate-limit
// decision sent in the same round trip. The decision is applied first: a
// denial (or a limit that could not be applied) gives back a lock the
// reserve took, and the request is answered as the limiter would have.
func (s *Server) idemReserveWithLimit(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp string, pl *pendingLimit) (string, bool) {
	ctx := r.Context()
	owner := s.idemOwner()
	rctx, cancel := context.WithTimeout(ctx, min(s.idem.cfg.RedisBudget, pl.pr.Timeout()))
	res, reply, err := s.idem.store.ReserveWith(rctx, k, fp, owner, *pl.pr.Call())
	cancel()
	acquired := err == nil && res.Outcome == store.IdemAcquired
	if !pl.apply(pl.pr.Finish(reply)) {
		if acquired {
			s.idemRelease(ctx, k, owner)
		}
		return "", false
	}
	if derr := deferredDB0(ctx); derr != nil {
		if acquired {
			s.idemRelease(ctx, k, owner)
		}
		s.idemFallback(w, r, op, k, fp, derr)
		return "", false
	}
	return s.idemReserved(w, r, op, k, fp, owner, res, err)
}

// idemReserved answers the reserve's outcome: the owner and true when the
// request runs, else the request is answered here.
func (s *Server) idemReserved(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp, owner string, res store.IdemReservation, err error) (string, bool) {
	ctx := r.Context()
	if err != nil {
		s.idemFallback(w, r, op, k, fp, err)
		return "", false
	}
	if res.Outcome == store.IdemInProgress {
		if s.idemDurableAnswer(w, r, op, k, fp) {
			return "", false
		}
		res = s.idemTakeOver(ctx, k, fp, owner, res)
	}
	switch res.Outcome {
	case store.IdemReplay:
		s.idemCount(op, idemOutcomeReplay)
		s.idemReplay(w, r, op, res.Record)
		return "", false
	case store.IdemConflict:
		s.idemCount(op, idemOutcomeConflict)
		s.fail(w, r, errIdemKeyReused)
		return "", false
	case store.IdemInProgress:
		s.idemCount(op, idemOutcomeBusy)
		s.fail(w, r, errIdemInProgress)
		return "", false
	}
	return owner, true
}

// idemRun is the run phase: op runs under owner's lock, kept alive by a
// heartbeat; a success completes the record and is answered, a failure
// gives the key back.
func (s *Server) idemRun(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp, owner string) {
	ctx := r.Context()
	stop := s.idemHeartbeat(k, owner)
	s.idemStage("locked")
	// The durable record expires RecordTTL after its transaction's start,
	// which is after this: counted from here, the Redis record does not
	// outlive it.
	expires := time.Now().Add(s.idem.cfg.RecordTTL)
	out, err := op.exec(ctx, &idemTarget{key: k, fp: fp, ttl: s.idem.cfg.RecordTTL})
	if err == nil {
		s.idemStage("committed")
	}
	stop()
	switch {
	case errors.Is(err, store.ErrIdemExists):
		s.idemRecover(w, r, op, k, fp, owner)
		return
	case err != nil:
		s.idemRelease(ctx, k, owner)
		s.idemCount(op, idemOutcomeFailed)
		s.fail(w, r, err)
		return
	}
	out.rec.Fingerprint = fp
	// Not waited for: PostgreSQL already holds the record, and a retry
	// that meets the lock before the complete lands is answered from it.
	if ttl := time.Until(expires); ttl >= time.Millisecond {
		s.idem.store.CompleteLater(k, owner, out.rec, ttl, func(err error) {
			if err != nil {
				s.metrics.errors.WithLabelValues("redis", "idempotency_complete").Inc()
			}
		})
	} else {
		s.idemRelease(ctx, k, owner)
	}
	if out.after != nil {
		out.after()
	}
	s.idemCount(op, idemOutcomeCreated)
	writeRawJSON(w, out.rec.Status, out.body)
}

// idemRecover is the recover phase: PostgreSQL holds a live record that
// Redis lost (eviction, restart, empty restore), so the request is answered
// from it and Redis re-warmed for what is left of the row's life, never a
// fresh RecordTTL: once the row expired the key is absent in both, and the
// attachment janitor, which counts a record's life from its creation, does
// not purge a resource a Redis record still replays. The business
// transaction rolled back, so nothing happened twice.
func (s *Server) idemRecover(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp, owner string) {
	ctx := r.Context()
	rec, found, err := s.store.LookupIdempotency(ctx, k)
	switch {
	case err != nil:
		s.idemRelease(ctx, k, owner)
		s.fail(w, r, err)
	case !found:
		// It expired between the insert and the lookup: try again.
		s.idemRelease(ctx, k, owner)
		s.idemCount(op, idemOutcomeBusy)
		s.fail(w, r, errIdemInProgress)
	case rec.Fingerprint != fp:
		s.idemRelease(ctx, k, owner)
		s.idemCount(op, idemOutcomeConflict)
		s.fail(w, r, errIdemKeyReused)
	default:
		if ttl := time.Until(rec.Expires); ttl >= time.Millisecond {
			s.idemComplete(ctx, k, owner, rec, ttl)
		} else {
			s.idemRelease(ctx, k, owner)
		}
		s.idemCount(op, idemOutcomeReplayPG)
		s.idemReplay(w, r, op, rec)
	}
}

// idemCount counts one keyed request of op by its outcome.
func (s *Server) idemCount(op idemOp, outcome string) {
	s.idem.requests.WithLabelValues(op.scope, outcome).Inc()
}

// idemOwner is a fresh lock owner token, "<random>:<instance id>" when the
// server knows its instance (the random part has no colon).
func (s *Server) idemOwner() string {
	if s.idem.cfg.InstanceID == "" {
		return randomToken()
	}
	return randomToken() + ":" + s.idem.cfg.InstanceID
}

// ownerInstance is the instance id an owner token names ("" for none).
func ownerInstance(owner string) string {
	_, inst, _ := strings.Cut(owner, ":")
	return inst
}

func (s *Server) idemStage(name string) {
	if s.idem.stage != nil {
		s.idem.stage(name)
	}
}

// idemDurableAnswer answers a request that met another owner's lock from
// the completed PostgreSQL record when there is one: the owner committed but
// never completed the Redis record (it crashed in between, or its Redis call
// failed), so the lock says "in progress" although the outcome is final. It
// reports whether it answered; a lookup failure leaves the request to the
// in-progress answer.
func (s *Server) idemDurableAnswer(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp string) bool {
	rec, found, err := s.store.LookupIdempotency(r.Context(), k)
	switch {
	case err != nil || !found:
		return false
	case rec.Fingerprint == fp:
		s.idemCount(op, idemOutcomeReplayPG)
		s.idemReplay(w, r, op, rec)
	default:
		s.idemCount(op, idemOutcomeConflict)
		s.fail(w, r, errIdemKeyReused)
	}
	return true
}

// idemTakeOver takes the lock res met over for owner when the lock's
// instance is dead: its presence liveness marker in DB1 is gone. The marker
// and the lock live in different databases, so the check is made here and
// the swap is a compare-and-swap on the lock value seen (store.TakeOver):
// two survivors that both saw the dead owner cannot both run the request.
// It returns the new reservation, or res unchanged when the owner is alive,
// names no instance, is this instance, or DB1 cannot tell (a live owner is
// never taken over on a guess; the PostgreSQL unique key would still stop a
// second effect if a live instance lost its marker).
func (s *Server) idemTakeOver(ctx context.Context, k store.IdemKey, fp, owner string, res store.IdemReservation) store.IdemReservation {
	inst := ownerInstance(res.Holder)
	if inst == "" || inst == s.idem.cfg.InstanceID || s.rt == nil {
		return res
	}
	cctx, cancel := context.WithTimeout(ctx, s.idem.cfg.RedisBudget)
	alive, err := s.rt.Exists(cctx, presence.InstanceKey(inst)).Result()
	cancel()
	if err != nil || alive != 0 {
		return res
	}
	cctx, cancel = context.WithTimeout(ctx, s.idem.cfg.RedisBudget)
	taken, err := s.idem.store.TakeOver(cctx, k, fp, res.Holder, owner)
	cancel()
	if err != nil {
		return res
	}
	if taken.Outcome == store.IdemAcquired {
		s.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lock of a dead instance taken over",
			slog.String("scope", k.Scope), slog.String("dead_instance", inst))
	}
	return taken
}

// idemFallback answers a keyed request while DB0 failed: a
// completed PostgreSQL record with this fingerprint is replayed, another
// fingerprint is a conflict, and anything else fails closed with the Redis
// error (503 redis_unavailable / redis_oom / redis_expiry_denied).
func (s *Server) idemFallback(w http.ResponseWriter, r *http.Request, op idemOp, k store.IdemKey, fp string, redisErr error) {
	rec, found, err := s.store.LookupIdempotency(r.Context(), k)
	switch {
	case err != nil:
		s.fail(w, r, err)
	case found && rec.Fingerprint == fp:
		s.idemCount(op, idemOutcomeReplayPG)
		s.idemReplay(w, r, op, rec)
	case found:
		s.idemCount(op, idemOutcomeConflict)
		s.fail(w, r, errIdemKeyReused)
	default:
		s.idemCount(op, idemOutcomeFailClose)
		if !errors.Is(redisErr, rds.ErrRedisOOM) && !errors.Is(redisErr, rds.ErrExpiryDenied) {
			redisErr = rds.ErrRedisUnavailable
		}
		s.fail(w, r, redisErr)
	}
}

// idemReplay answers with the stored outcome, rebuilt from its resource.
func (s *Server) idemReplay(w http.ResponseWriter, r *http.Request, op idemOp, rec store.IdemRecord) {
	// It sends nothing: a message send's dialog admission goes back.
	settleDialogSpend(r, refundDialogUnsent)
	body, err := op.render(r.Context(), rec)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set(idemReplayedHeader, "true")
	writeRawJSON(w, rec.Status, body)
}

// idemComplete and idemRelease run with their own budget, detached from the
// client's cancellation: a client that hung up must not leave the key
// locked. A failure is harmless: PostgreSQL holds completed records, and an
// unreleased lock expires.
func (s *Server) idemComplete(ctx context.Context, k store.IdemKey, owner string, rec store.IdemRecord, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.idem.cfg.RedisBudget)
	defer cancel()
	if _, err := s.idem.store.Complete(ctx, k, owner, rec, ttl); err != nil {
		s.metrics.errors.WithLabelValues("redis", "idempotency_complete").Inc()
	}
}

func (s *Server) idemRelease(ctx context.Context, k store.IdemKey, owner string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.idem.cfg.RedisBudget)
	defer cancel()
	if _, err := s.idem.store.Release(ctx, k, owner); err != nil {
		s.metrics.errors.WithLabelValues("redis", "idempotency_release").Inc()
	}
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
