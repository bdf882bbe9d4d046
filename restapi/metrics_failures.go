package restapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// failureMetrics counts, at the single error-mapping place (Server.fail),
// dependency failures by kind and project API writes refused by the
// eviction-policy / memory gate. Every label is from a fixed set.
type failureMetrics struct {
	refused *prometheus.CounterVec
}

func newFailureMetrics(reg prometheus.Registerer, errs *prometheus.CounterVec) *failureMetrics {
	f := &failureMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_project_writes_refused_total",
			Help: "Project Redis API writes refused before touching Redis, by reason (unsafe_eviction_policy, redis_oom, redis_expiry_denied).",
		}, []string{"reason"}),
	}
	reg.MustRegister(f.refused)
	for _, r := range []string{"unsafe_eviction_policy", "redis_oom", "redis_expiry_denied"} {
		f.refused.WithLabelValues(r)
	}
	for _, dk := range [][2]string{{"redis", "unavailable"}, {"redis", "oom"}, {"redis", "expiry_denied"},
		{"redis", "noperm"}, {"redis", "data_state_invalid"}, {"postgres", "unavailable"}, {"postgres", "busy"}} {
		errs.WithLabelValues(dk[0], dk[1])
	}
	return f
}

// dependencyKind classifies err for han_dependency_errors_total; ok is
// false for errors that are not a dependency failure.
func dependencyKind(err error) (dependency, kind string, ok bool) {
	switch {
	case errors.Is(err, rds.ErrRedisOOM):
		return "redis", "oom", true
	case errors.Is(err, rds.ErrExpiryDenied):
		return "redis", "expiry_denied", true
	case errors.Is(err, rds.ErrRedisNoPerm):
		return "redis", "noperm", true
	case errors.Is(err, rds.ErrRedisUnavailable):
		return "redis", "unavailable", true
	case errors.Is(err, store.ErrDataStateInvalid):
		return "redis", "data_state_invalid", true
	case store.IsDatabaseBusy(err):
		return "postgres", "busy", true
	case isPGUnavailable(err):
		return "postgres", "unavailable", true
	}
	return "", "", false
}

// countFailure records what Server.fail answered.
func (m *Metrics) countFailure(r *http.Request, err error, e *Error) {
	if m == nil || m.failures == nil {
		return
	}
	if dep, kind, ok := dependencyKind(err); ok {
		m.errors.WithLabelValues(dep, kind).Inc()
	}
	if r.Method == http.MethodGet || !strings.HasPrefix(r.URL.Path, "/projects/") {
		return
	}
	switch e.Code {
	case "unsafe_eviction_policy", "redis_oom", "redis_expiry_denied":
		m.failures.refused.WithLabelValues(e.Code).Inc()
	}
}
