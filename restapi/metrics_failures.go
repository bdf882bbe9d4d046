package restapi

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/store"
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
	for _, l := range dependencyLabels {
		errs.WithLabelValues(l[0], l[1])
	}
	errs.WithLabelValues("postgres", "unavailable")
	return f
}

// dependencyLabels are the han_dependency_errors_total labels of the error
// kinds (store.Kind) that mean a dependency failed.
var dependencyLabels = map[string][2]string{
	"redis_oom":                {"redis", "oom"},
	"redis_expiry_denied":      {"redis", "expiry_denied"},
	"redis_noperm":             {"redis", "noperm"},
	"redis_unavailable":        {"redis", "unavailable"},
	"redis_data_state_invalid": {"redis", "data_state_invalid"},
	"pg_busy":                  {"postgres", "busy"},
	"blob_store_full":          {"blob_store", "full"},
	"blob_store_unavailable":   {"blob_store", "unavailable"},
}

// dependencyFailure returns err's han_dependency_errors_total labels; ok
// is false for errors that are not a dependency failure.
func dependencyFailure(err error) (labels [2]string, ok bool) {
	if labels, ok = dependencyLabels[store.Kind(err)]; ok {
		return labels, true
	}
	if store.IsPGUnavailable(err) {
		return [2]string{"postgres", "unavailable"}, true
	}
	return labels, false
}

// countFailure records what Server.fail answered.
func (m *Metrics) countFailure(r *http.Request, err error, e *Error) {
	if m == nil || m.failures == nil {
		return
	}
	if l, ok := dependencyFailure(err); ok {
		m.errors.WithLabelValues(l[0], l[1]).Inc()
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead || !strings.HasPrefix(r.URL.Path, "/projects/") {
		return
	}
	switch e.Code {
	case "unsafe_eviction_policy", "redis_oom", "redis_expiry_denied":
		m.failures.refused.WithLabelValues(e.Code).Inc()
	}
}
