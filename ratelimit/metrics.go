package ratelimit

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the limiter's Prometheus families; a nil *metrics counts nothing.
type metrics struct {
	decisions *prometheus.CounterVec
	refunds   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_ratelimit_decisions_total",
			Help: "Rate-limit decisions by route label and result (allowed, denied, fallback, fallback_denied, error).",
		}, []string{"route", "result"}),
		refunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "han_ratelimit_refunds_total",
			Help: "Admissions given back, by result: ok after a later family denied the request (per-family mode), unanswered for a refused request whose decision got no reply and ran late, dialog_not_found for a message send into a dialog its sender is not in, dialog_unsent for a message send answered otherwise without sending (refused, replayed); failed when a refund could not be made.",
		}, []string{"result"}),
	}
	// Several limiters on one registry (one per server in tests) share the
	// families registered first.
	for _, c := range []**prometheus.CounterVec{&m.decisions, &m.refunds} {
		if err := reg.Register(*c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, err
			}
			*c = existing
		}
	}
	return m, nil
}

func (m *metrics) decision(route, result string) {
	if m != nil {
		m.decisions.WithLabelValues(route, result).Inc()
	}
}

func (m *metrics) refund(result string) {
	if m != nil {
		m.refunds.WithLabelValues(result).Inc()
	}
}
