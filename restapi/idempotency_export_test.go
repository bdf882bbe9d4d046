package restapi

// SetIdempotencyKeyOptional lets benchmarks send without an Idempotency-Key
// (the baseline of the idempotency overhead); production always requires it.
func SetIdempotencyKeyOptional(s *Server, v bool) { s.idem.keyOptional = v }

// SetIdempotencyStage lets a test stop a request at the points where an
// instance crash leaves its lock behind ("locked", "committed").
func SetIdempotencyStage(s *Server, f func(name string)) { s.idem.stage = f }
