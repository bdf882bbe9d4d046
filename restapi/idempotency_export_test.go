package restapi

// SetIdempotencyKeyOptional lets benchmarks send without an Idempotency-Key
// (the baseline of the idempotency overhead); production always requires it.
func SetIdempotencyKeyOptional(s *Server, v bool) { s.idem.keyOptional = v }
