package ratelimit

// Decision is the outcome of one rate-limit evaluation. Times are epoch ms of
// the clock that decided (Redis TIME, or the process clock for a local
// decision).
type Decision struct {
	Allowed bool
	// Remaining is the smallest number of further requests any family of
	// the policy admits now (after this request when it was allowed).
	Remaining int64
	// RetryAfterMs is ResetAtMs - NowMs for a denial, 0 when allowed.
	RetryAfterMs int64
	// ResetAtMs: for a denial, the first instant at which the request would
	// be admitted (no request is admitted before it, and the first one at or
	// after it is, absent other traffic); when allowed, the reset of the
	// family closest to its limit.
	ResetAtMs int64
	// NowMs is the clock reading the decision used.
	NowMs int64
	// Local is true when the in-process fallback limiter decided because
	// Redis could not.
	Local bool
	// Families has one entry per family that applied, in policy order.
	Families []FamilyDecision

	// id and algo name a Redis admission for Limiter.Refund ("" for a
	// local decision, which has nothing in Redis to give back).
	id   string
	algo Algorithm
}

// FamilyDecision is one family's state after the decision.
type FamilyDecision struct {
	Rule      Rule
	Remaining int64
	ResetAtMs int64

	key string // the family's Redis key (Redis decisions only)
}

// ceilSeconds is ceil(ms / 1000) for ms >= 0.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// RetryAfterSeconds is the Retry-After value of a denial:
// ceil((ResetAtMs - NowMs) / 1000), at least 1; 0 when allowed.
func (d Decision) RetryAfterSeconds() int {
	if d.Allowed {
		return 0
	}
	s := ceilSeconds(d.ResetAtMs - d.NowMs)
	if s < 1 {
		s = 1
	}
	return int(s)
}

// LimitedError is the error form of a denial: restapi renders it as 429
// rate_limited with Retry-After.
type LimitedError struct{ Decision Decision }

func (e *LimitedError) Error() string { return "ratelimit: rate limited" }
