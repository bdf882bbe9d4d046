package restapi

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics owns the Prometheus registry of the process. Every feature
// registers its own families on Registry; the HTTP families live here.
type Metrics struct {
	Registry *prometheus.Registry

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	authFailures *prometheus.CounterVec // verifyCredential (authfail.go)
	failures     *failureMetrics        // metrics_failures.go
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// NewMetrics creates the registry with the Go runtime and process collectors.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: reg,
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_http_requests_total", Help: "HTTP requests by route template, method (a standard method, else other) and status code.",
		}, []string{"route", "method", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "han_http_request_duration_seconds", Help: "HTTP request latency by route template.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_dependency_errors_total", Help: "Failures talking to Redis, PostgreSQL or the blob store by dependency and kind.",
		}, []string{"dependency", "kind"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_http_auth_failures_total",
			Help: "Requests to routes that need a token answered 401 (result missing: no token; refused: the token failed verification) or 429 without verifying, their client address over its budget of those (limited).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.httpRequests, m.httpDuration, m.errors, m.authFailures)
	for _, r := range []string{"missing", "refused", "limited"} {
		m.authFailures.WithLabelValues(r)
	}
	m.failures = newFailureMetrics(reg, m.errors)
	return m
}
