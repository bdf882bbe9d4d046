package restapi

import (
	"net/http"
)

// RateLimiter decides whether a request on a limited route may proceed.
// Allow writes the complete response itself (429 with Retry-After and the
// RateLimit fields, or 503 when it fails closed) and returns false when the
// request must stop; on true it may have set RateLimit headers already.
type RateLimiter interface {
	Allow(w http.ResponseWriter, r *http.Request, route string) bool
}

func (s *Server) rateLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.limiter != nil && !s.limiter.Allow(w, r, RouteTemplate(r)) {
			return
		}
		next.ServeHTTP(w, r)
		// A decision left pending that no answer settled (a handler that
		// answered without the reserve or an error) is still counted.
		if pl := takeLimit(r.Context()); pl != nil {
			_, _ = pl.decision(r.Context())
		}
		// A dialog admission no answer settled belongs to a request that
		// committed no send (a commit settles it): it goes back.
		settleDialogSpend(r, refundDialogUnsent)
	})
}
