package lua

// Rate limiting in DB0 (docs/ratelimit.md). The three evaluate scripts share one
// calling convention: KEYS are the family keys of one request, ARGV[1] is the
// request id, then limit, window ms and jitter ms per key; each returns
// {allowed, remaining, retry_after_ms, reset_at_ms, now_ms, then remaining
// and reset_at_ms per key}.
var (
	RateLimitSliding = mustLoad("ratelimit_sliding")
	RateLimitFixed   = mustLoad("ratelimit_fixed")
	RateLimitBucket  = mustLoad("ratelimit_bucket")
	RateLimitRefund  = mustLoad("ratelimit_refund")
)
