package restapi

import (
	"context"
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
// sets the RateLimit-Policy / RateLimit fields. Which principals reach a
// route (none on /v1/public, service tokens on /v1/internal, user tokens on
// the rest) is what ratelimit.Callers assumes when it refuses a policy that
// would count none of them: the router's authentication and that function
// must agree (TestRateLimitCallersMatchTheRouter). Denials and fail-closed Redis
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
	if d := db0DeferralOf(r.Context()); d != nil {
		d.limitKeys = a.l.Keys(label, p, subj)
	}
	q := limitQuery{label: label, p: p, subj: subj}
	if holder := limitHolder(r); holder != nil {
		// Decided when the reserve is sent, after the body (on a Redis
		// Cluster alone, one call per family: ratelimit_paired.go).
		holder.limit = &pendingLimit{
			pr:     a.l.Prepare(label, p, subj),
			decide: func(ctx context.Context) (ratelimit.Decision, error) { return a.l.Decide(ctx, label, p, subj) },
			apply:  func(d ratelimit.Decision, err error) bool { return a.apply(w, r, q, d, err) },
		}
		return true
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
// or the 429/503 response; false when the request must stop. A message
// send's dialog admission is left to the answer (ratelimit_dialog.go), and
// the fields show the dialog only once the send proved its sender a member.
func (a *redisRateLimiter) apply(w http.ResponseWriter, r *http.Request, q limitQuery, d ratelimit.Decision, err error) bool {
	if err != nil {
		// The limiter keeps its own breaker; tell the server's DB0 health
		// too, so idempotency fails fast and the degraded gauge shows it.
		// On a Redis Cluster the failure is one master's, and marking all
		// of DB0 down would fail the requests on the healthy masters: the
		// health finds that master by the calls on its keys.
		if h := a.s.RedisHealth(); h != nil && !h.PerMaster() && errors.Is(err, rds.ErrRedisUnavailable) {
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
		// could spend the pool while DB0 is down. No send is written then,
		// so the dialog's limit has nothing to protect and is left out (an
		// outsider would spend it, and learn of the dialog from its 429).
		q.subj.DialogID = ""
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
	if !d.Allowed {
		return a.deny(w, r, q, d)
	}
	if !hasFamily(d, ratelimit.FamilyDialog) {
		setRateLimitFields(w, d)
		return true
	}
	setRateLimitFields(w, d.Without(ratelimit.FamilyDialog))
	holdDialogSpend(r, &dialogSpend{
		refund: func(result string) { a.l.Refund(r.Context(), d, ratelimit.FamilyDialog, result) },
		show:   func() { setRateLimitFields(w, d) },
	})
	return true
}

// deny answers denial d of q with 429. Its fields and Retry-After leave the
// dialog out, unless the dialog's limit alone refused the request: then
// whether the sender is a member decides (fullDialog).
func (a *redisRateLimiter) deny(w http.ResponseWriter, r *http.Request, q limitQuery, d ratelimit.Decision) bool {
	if d.DeniedOnlyBy(ratelimit.FamilyDialog) && q.subj.UserID != "" {
		return a.fullDialog(w, r, q, d)
	}
	d = d.Without(ratelimit.FamilyDialog)
	setRateLimitFields(w, d)
	a.s.fail(w, r, &ratelimit.LimitedError{Decision: d})
	return false
}

// fullDialog answers a send that the dialog's used-up limit alone refused
// (denial full). A member is answered 429 with the dialog's quota; anyone
// else gets what an unknown dialog id gets — its request goes on under its
// user and ip limits and is answered 404 dialog_not_found (or whatever
// refuses it first) — so a full dialog tells an outsider nothing. Telling
// the two apart takes a PostgreSQL query, so the request is first decided
// without the dialog: it is paid for from the sender's own limits, and past
// them answered 429 without a dialog item, before any query.
func (a *redisRateLimiter) fullDialog(w http.ResponseWriter, r *http.Request, q limitQuery, full ratelimit.Decision) bool {
	rest := q
	rest.subj.DialogID = ""
	d, err := a.l.Decide(context.WithoutCancel(r.Context()), rest.label, rest.p, rest.subj)
	if err != nil || !d.Allowed {
		return a.apply(w, r, rest, d, err)
	}
	member, err := a.s.store.IsMember(r.Context(), q.subj.DialogID, q.subj.UserID)
	switch {
	case err != nil:
		setRateLimitFields(w, d)
		a.s.fail(w, r, err)
		return false
	case !member:
		markOutsider(r)
		return a.apply(w, r, rest, d, nil)
	}
	// The member's 429: its own limits as they are now, the dialog's as
	// the denial found it, Retry-After when the dialog has room again.
	shown := full
	shown.Families = append(d.Families[:len(d.Families):len(d.Families)], dialogItem(full)...)
	setRateLimitFields(w, shown)
	a.s.fail(w, r, &ratelimit.LimitedError{Decision: shown})
	return false
}

// dialogItem is d's dialog family, if any.
func dialogItem(d ratelimit.Decision) []ratelimit.FamilyDecision {
	for _, f := range d.Families {
		if f.Rule.Family == ratelimit.FamilyDialog {
			return []ratelimit.FamilyDecision{f}
		}
	}
	return nil
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
