package restapi

import (
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store/rds"
)

// redisRateLimiter is the RateLimiter NewServer builds from Deps.RateLimits:
// it finds the route's policy (allow-listed template or "other"), names the
// subject of each family (user id, HMAC of the client address, the dialog of
// a message send, the svc claim of a service token), asks the limiter and
// sets the RateLimit-Policy / RateLimit fields. Denials and fail-closed Redis
// failures go through Server.fail, so their bodies come from the one mapping
// place (429 rate_limited with Retry-After, 503 redis_unavailable/redis_oom).
type redisRateLimiter struct {
	s *Server
	l *ratelimit.Limiter
}

var _ RateLimiter = (*redisRateLimiter)(nil)

func (a *redisRateLimiter) Allow(w http.ResponseWriter, r *http.Request, route string) bool {
	label, p := a.l.Policies().Lookup(r.Method, route)
	if len(p.Rules) == 0 {
		return true
	}
	subj := ratelimit.Subject{IPHMAC: a.s.ipHMAC(r)}
	if pr, ok := auth.PrincipalFrom(r.Context()); ok {
		switch pr.Kind {
		case auth.KindUser:
			subj.UserID = pr.UserID
		case auth.KindService:
			subj.Service = pr.Service
			if subj.Service == "" {
				subj.Service = "sub." + pr.UserID
			}
		}
	}
	for _, rule := range p.Rules {
		if rule.Family == ratelimit.FamilyDialog {
			// Only a well-formed id names a dialog; anything else is
			// refused by the handler (400) and must not mint keys.
			if id, ok := ids.Canonical(mux.Vars(r)["id"]); ok {
				subj.DialogID = id
			}
		}
	}
	q := limitQuery{label: label, p: p, subj: subj}
	if holder := limitHolder(r); holder != nil {
		if pr := a.l.Prepare(label, p, subj); pr != nil {
			holder.limit = &pendingLimit{pr: pr, apply: func(d ratelimit.Decision, err error) bool { return a.apply(w, r, q, d, err) }}
			return true
		}
	}
	d, err := a.l.Decide(r.Context(), label, p, subj)
	return a.apply(w, r, q, d, err)
}

// limitQuery is what a decision was asked about.
type limitQuery struct {
	label string
	p     ratelimit.Policy
	subj  ratelimit.Subject
}

// apply answers decision d (or the failure err) of q: the RateLimit fields,
// or the 429/503 response; false when the request must stop.
func (a *redisRateLimiter) apply(w http.ResponseWriter, r *http.Request, q limitQuery, d ratelimit.Decision, err error) bool {
	if err != nil {
		// The limiter keeps its own breaker; tell the server's DB0 health
		// too, so idempotency fails fast and the degraded gauge shows it.
		if h := a.s.RedisHealth(); h != nil && errors.Is(err, rds.ErrRedisUnavailable) {
			h.MarkDown()
		}
		if !DeferDB0Failure(r, err) {
			a.s.fail(w, r, err)
			return false
		}
		// Send, attachment init and download URL still answer from
		// PostgreSQL (a completed record is replayed, else 503), and each
		// such answer costs a PostgreSQL lookup: the in-process limiter
		// bounds them as it bounds the fallback-local routes, or one client
		// could spend the pool while DB0 is down.
		d = a.l.DecideLocal(q.label, q.p, q.subj)
		if d.Allowed {
			// No RateLimit fields: the answer is a replay or a 503,
			// which carries none.
			return true
		}
		setRateLimitFields(w, d)
		a.s.fail(w, r, &ratelimit.LimitedError{Decision: d})
		return false
	}
	setRateLimitFields(w, d)
	if !d.Allowed {
		a.s.fail(w, r, &ratelimit.LimitedError{Decision: d})
		return false
	}
	if hasFamily(d, ratelimit.FamilyDialog) {
		onDialogNotFound(r, func() { a.refundDialog(w, r, d) })
	}
	return true
}

// refundDialog gives back admission d's dialog family when the request was
// answered dialog_not_found (its sender is not a member, or the dialog does
// not exist): the dialog's limit protects its members from a flood, and
// outsiders who spent it would silence them, each refused try costing them
// only their own user limit, which stays charged. The answer's RateLimit
// fields then leave the dialog out, so an outsider learns nothing of its
// traffic.
func (a *redisRateLimiter) refundDialog(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
	a.l.Refund(r.Context(), d, ratelimit.FamilyDialog, "dialog_not_found")
	kept := d
	kept.Families = make([]ratelimit.FamilyDecision, 0, len(d.Families))
	for _, f := range d.Families {
		if f.Rule.Family != ratelimit.FamilyDialog {
			kept.Families = append(kept.Families, f)
		}
	}
	h := w.Header()
	h.Del("RateLimit-Policy")
	h.Del("RateLimit")
	setRateLimitFields(w, kept)
}

func setRateLimitFields(w http.ResponseWriter, d ratelimit.Decision) {
	if len(d.Families) > 0 {
		h := w.Header()
		h.Set("RateLimit-Policy", ratelimit.PolicyField(d))
		h.Set("RateLimit", ratelimit.StateField(d))
	}
}

func hasFamily(d ratelimit.Decision, f ratelimit.Family) bool {
	for _, fd := range d.Families {
		if fd.Rule.Family == f {
			return true
		}
	}
	return false
}

// rateLimitedError maps a denial for Server.fail: 429 rate_limited with
// Retry-After = ceil((reset_at_ms - now_ms) / 1000) seconds.
func rateLimitedError(err error) (*Error, bool) {
	var le *ratelimit.LimitedError
	if !errors.As(err, &le) {
		return nil, false
	}
	e := *errRateLimited
	e.RetryAfter = le.Decision.RetryAfterSeconds()
	return &e, true
}

// errRateLimited is the denial; each answer carries its own Retry-After.
var errRateLimited = apierr.New(http.StatusTooManyRequests, "rate_limited")

// isRateLimited is rateLimitedError in the shape of a case of fail's switch.
func isRateLimited(err error, e **Error) bool {
	le, ok := rateLimitedError(err)
	if ok {
		*e = le
	}
	return ok
}
