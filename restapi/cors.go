package restapi

import (
	"net/http"
)

// The CORS answer of the REST API. Credentials stay off: the API
// authenticates with a bearer token in Authorization, never a cookie, so a
// page must hold the token itself and no ambient credential crosses
// origins.
const (
	corsAllowMethods  = "GET, HEAD, POST, PUT, PATCH, DELETE"
	corsAllowHeaders  = "Authorization, Content-Type, Idempotency-Key"
	corsExposeHeaders = "Retry-After, RateLimit, RateLimit-Policy, Idempotent-Replayed"
	corsMaxAge        = "600"
)

// cors lets pages of the origins in Config.CORSOrigins call the API's own
// paths (IsAPIPath) from a browser; other origins get no CORS header, so
// their browser keeps the answer from the page. It answers OPTIONS itself,
// before the router: a preflight carries no token, so it must not meet
// authentication, and OPTIONS is no method mismatch: 204 on any path an API
// route serves, 404 not_found elsewhere, and on a path not in canonical
// form (a "." or ".." segment fills a route's {var}, yet every method but
// GET and HEAD is 404 on such a path: canonicalPath).
func (s *Server) cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsAPIPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		origin := r.Header.Get("Origin")
		listed := origin != "" && s.corsOrigins[origin]
		if len(s.corsOrigins) > 0 {
			// The answer differs by Origin: a shared cache must not give
			// one origin's answer to another.
			h.Add("Vary", "Origin")
		}
		if r.Method == http.MethodOptions {
			if refusedSpelling(r) || len(s.servedMethods(r)) == 0 {
				writeError(w, errNotFound)
				return
			}
			if listed && r.Header.Get("Access-Control-Request-Method") != "" {
				h.Set("Access-Control-Allow-Origin", origin)
				h.Set("Access-Control-Allow-Methods", corsAllowMethods)
				h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
				h.Set("Access-Control-Max-Age", corsMaxAge)
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if listed {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		}
		next.ServeHTTP(w, r)
	})
}
