package restapi

import (
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
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
	if holder := limitHolder(r, route); holder != nil {
		if pr := a.l.Prepare(label, p, subj); pr != nil {
			holder.limit = &pendingLimit{pr: pr, apply: func(d ratelimit.Decision, err error) bool { return a.apply(w, r, d, err) }}
			return true
		}
	}
	d, err := a.l.Decide(r.Context(), label, p, subj)
	return a.apply(w, r, d, err)
}

// apply answers decision d (or the failure err): the RateLimit fields, or
// the 429/503 response; false when the request must stop.
func (a *redisRateLimiter) apply(w http.ResponseWriter, r *http.Request, d ratelimit.Decision, err error) bool {
	if err != nil {
		// The limiter keeps its own breaker; tell the server's DB0 health
		// too, so idempotency fails fast and the degraded gauge shows it.
		if h := a.s.RedisHealth(); h != nil && errors.Is(err, rds.ErrRedisUnavailable) {
			h.MarkDown()
		}
		// Send, attachment init and download URL may still replay a
		// completed record from PostgreSQL: their handler decides.
		if DeferDB0Failure(r, err) {
			return true
		}
		a.s.fail(w, r, err)
		return false
	}
	if len(d.Families) > 0 {
		h := w.Header()
		h.Set("RateLimit-Policy", ratelimit.PolicyField(d))
		h.Set("RateLimit", ratelimit.StateField(d))
	}
	if !d.Allowed {
		a.s.fail(w, r, &ratelimit.LimitedError{Decision: d})
		return false
	}
	return true
}

// rateLimitedError maps a denial for Server.fail: 429 rate_limited with
// Retry-After = ceil((reset_at_ms - now_ms) / 1000) seconds.
func rateLimitedError(err error) (*Error, bool) {
	var le *ratelimit.LimitedError
	if !errors.As(err, &le) {
		return nil, false
	}
	return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", RetryAfter: le.Decision.RetryAfterSeconds()}, true
}

// isRateLimited is rateLimitedError in the shape of a case of fail's switch.
func isRateLimited(err error, e **Error) bool {
	le, ok := rateLimitedError(err)
	if ok {
		*e = le
	}
	return ok
}
