package restapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	projectapi "github.com/han-app/gateway/restapi/project"
)

// projectRoutes mounts the project Redis API (package restapi/project) on
// the root router, not under /v1: user tokens only, the project body limit,
// the rate-limit seam, failures answered by fail.
func (s *Server) projectRoutes(r *mux.Router) {
	s.prj = projectapi.New(projectapi.Deps{
		Host: projectHost{s}, Store: s.store, Redis: s.rdb, Logger: s.logger,
		Env: s.cfg.Env, EvictionPolicyTTL: s.cfg.EvictionPolicyTTL, Queue: s.cfg.ProjectQueue,
		BodyLimit:    ProjectBodyLimit,
		Authenticate: s.authenticate(true), RateLimit: s.rateLimit,
		Registry: s.metrics.Registry, DependencyErrors: s.metrics.errors,
	})
	s.prj.Mount(r)
}

// projectHost lends the server's body reader, JSON writer, limit parser
// and error writer to the project API.
type projectHost struct{ s *Server }

func (h projectHost) ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return readBody(w, r, limit)
}

func (h projectHost) WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

func (h projectHost) ParseLimit(r *http.Request, def, max int) (int, error) {
	return parseLimit(r, def, max)
}

func (h projectHost) Fail(w http.ResponseWriter, r *http.Request, err error) { h.s.fail(w, r, err) }

func (h projectHost) RequestID(ctx context.Context) string { return requestID(ctx) }

func (h projectHost) Route(r *http.Request) string { return RouteTemplate(r) }
