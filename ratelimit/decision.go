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

// DeniedOnlyBy reports whether d is a denial that family f alone made:
// f's item is exhausted and every other family still had room.
func (d Decision) DeniedOnlyBy(f Family) bool {
	if d.Allowed {
		return false
	}
	found := false
	for _, fd := range d.Families {
		switch {
		case fd.Rule.Family == f:
			found = fd.Remaining <= 0
		case fd.Remaining <= 0:
			return false
		}
	}
	return found
}

// Without is d as if family f had not applied: f's item is left out, and
// Remaining and ResetAtMs (RetryAfterMs of a denial) are recomputed from the
// families left, as the decision scripts compute them: of an admission, the
// family closest to its limit; of a denial, the latest reset among the
// families that deny, so its Retry-After tells nothing of f. A denial that f
// alone made keeps its times (there is nothing else to wait for). It is for
// an answer that must not describe f; Refund of the result gives nothing of
// f back.
func (d Decision) Without(f Family) Decision {
	out := d
	out.Families = make([]FamilyDecision, 0, len(d.Families))
	for _, fd := range d.Families {
		if fd.Rule.Family != f {
			out.Families = append(out.Families, fd)
		}
	}
	if len(out.Families) == len(d.Families) || len(out.Families) == 0 {
		return out
	}
	if d.Allowed {
		out.Remaining = -1
		for _, fd := range out.Families {
			if out.Remaining < 0 || fd.Remaining < out.Remaining || (fd.Remaining == out.Remaining && fd.ResetAtMs > out.ResetAtMs) {
				out.Remaining, out.ResetAtMs = fd.Remaining, fd.ResetAtMs
			}
		}
		return out
	}
	var reset int64
	for i, fd := range out.Families {
		if i == 0 || fd.Remaining < out.Remaining {
			out.Remaining = max(fd.Remaining, 0)
		}
		if fd.Remaining <= 0 && fd.ResetAtMs > reset {
			reset = fd.ResetAtMs
		}
	}
	if reset > 0 {
		out.ResetAtMs, out.RetryAfterMs = reset, reset-d.NowMs
	}
	return out
}
