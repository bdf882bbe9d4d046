package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// hubCollector exports the hub's counters (WebSocket connections,
// subscriptions, queue drops).
type hubCollector struct {
	h *Hub

	connections, subscriptions, maxQueue      *prometheus.Desc
	overflows, slowCloses, drops, resyncs, in *prometheus.Desc
	closes, rejects, refreshRejects           *prometheus.Desc
	recoverReads, recoveries, recoverRefused  *prometheus.Desc
	handshakes, handshakeQueue                *prometheus.Desc
	handshakeWaits, handshakeWaitSeconds      *prometheus.Desc
	subscribeChecks, subscribeCheckQueries    *prometheus.Desc
	inlineWrites                              *prometheus.Desc
}

func registerHubMetrics(reg prometheus.Registerer, h *Hub) error {
	return reg.Register(&hubCollector{h: h,
		connections:           prometheus.NewDesc("han_ws_connections", "Open WebSocket connections on this instance.", nil, nil),
		subscriptions:         prometheus.NewDesc("han_ws_subscriptions", "Dialog subscriptions over all connections.", nil, nil),
		maxQueue:              prometheus.NewDesc("han_ws_queue_max_frames", "Deepest outbound queue any connection has had.", nil, nil),
		overflows:             prometheus.NewDesc("han_ws_queue_overflows_total", "Outbound queue overflows: queued events replaced by one resync.", nil, nil),
		slowCloses:            prometheus.NewDesc("han_ws_slow_consumer_closes_total", "Connections closed because they could not keep up.", nil, nil),
		drops:                 prometheus.NewDesc("han_ws_queue_drops_total", "Frames not queued, by class (ephemeral, covered by a queued resync, typing rate).", []string{"class"}, nil),
		resyncs:               prometheus.NewDesc("han_ws_resyncs_total", "resync frames queued.", nil, nil),
		in:                    prometheus.NewDesc("han_ws_frames_received_total", "Client frames received.", nil, nil),
		closes:                prometheus.NewDesc("han_ws_closes_total", "Connections closed by the server, by close code.", []string{"code"}, nil),
		rejects:               prometheus.NewDesc("han_ws_rejected_total", "Connection attempts refused, by reason.", []string{"reason"}, nil),
		recoverReads:          prometheus.NewDesc("han_ws_recover_reads_total", "Recovery reads of subscribes with sinceSeq (one per dialog serves many subscribes), by result.", []string{"result"}, nil),
		recoveries:            prometheus.NewDesc("han_ws_recoveries_total", "Subscribes with sinceSeq, by outcome (recovered over the socket, or resync).", []string{"outcome"}, nil),
		handshakes:            prometheus.NewDesc("han_ws_handshakes_active", "Handshakes doing their Redis and PostgreSQL work now (at most HAN_WS_HANDSHAKE_CONCURRENCY).", nil, nil),
		handshakeQueue:        prometheus.NewDesc("han_ws_handshake_queue", "Handshakes waiting for an admission slot now (at most HAN_WS_HANDSHAKE_QUEUE).", nil, nil),
		handshakeWaits:        prometheus.NewDesc("han_ws_handshake_queue_waits_total", "Handshakes that waited in the admission queue and were admitted.", nil, nil),
		handshakeWaitSeconds:  prometheus.NewDesc("han_ws_handshake_queue_wait_seconds_total", "Total time admitted handshakes waited in the admission queue.", nil, nil),
		subscribeChecks:       prometheus.NewDesc("han_ws_subscribe_checks_total", "Subscribe checks (membership and lastSeq) made.", nil, nil),
		subscribeCheckQueries: prometheus.NewDesc("han_ws_subscribe_check_queries_total", "PostgreSQL queries that answered the subscribe checks (concurrent checks share one).", nil, nil),
		inlineWrites: prometheus.NewDesc("han_ws_inline_writes_total",
			"Queues written by the goroutine that filled them, without a writer goroutine, by outcome (whole: the socket took every byte; rest: a writer finished them).", []string{"outcome"}, nil),
		recoverRefused: prometheus.NewDesc("han_ws_recover_reads_refused_total",
			"Subscribes with sinceSeq answered with the dialog's resync because their user had no recovery read left on this instance (HAN_WS_RECOVER_READ_RATE, HAN_WS_RECOVER_READ_BURST); also counted in han_ws_recoveries_total{outcome=\"resync\"}.", nil, nil),
		refreshRejects: prometheus.NewDesc("han_ws_refresh_rejected_total",
			"Refresh frames refused, by reason (auth_limited: the client's budget of refused credentials was spent, the token not verified; unauthorized: the token failed verification; forbidden, user_mismatch: closed with 4003).", []string{"reason"}, nil),
	})
}

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.connections, c.subscriptions, c.maxQueue, c.overflows, c.slowCloses, c.drops, c.resyncs, c.in, c.closes, c.rejects, c.refreshRejects, c.recoverReads, c.recoveries, c.recoverRefused,
		c.handshakes, c.handshakeQueue, c.handshakeWaits, c.handshakeWaitSeconds, c.subscribeChecks, c.subscribeCheckQueries, c.inlineWrites} {
		ch <- d
	}
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.h.Stats()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	n := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	g(c.connections, float64(st.Connections))
	g(c.subscriptions, float64(st.Subscriptions))
	g(c.maxQueue, float64(st.MaxQueueFrames))
	n(c.overflows, st.QueueOverflows)
	n(c.slowCloses, st.SlowConsumerCloses)
	n(c.drops, st.EphemeralDrops, "ephemeral")
	n(c.drops, st.CoveredDrops, "covered")
	n(c.drops, st.TypingDrops, "typing_rate")
	n(c.resyncs, st.Resyncs)
	n(c.in, st.FramesIn)
	n(c.recoverReads, st.RecoverReads-st.RecoverReadErrors, "ok")
	n(c.recoverReads, st.RecoverReadErrors, "error")
	n(c.recoveries, st.Recovered, "recovered")
	n(c.recoveries, st.RecoverResyncs, "resync")
	n(c.recoverRefused, st.RecoverReadsRefused)
	g(c.handshakes, float64(st.HandshakesActive))
	g(c.handshakeQueue, float64(st.HandshakesQueued))
	n(c.handshakeWaits, st.HandshakeWaits)
	ch <- prometheus.MustNewConstMetric(c.handshakeWaitSeconds, prometheus.CounterValue, st.HandshakeWaitSeconds)
	n(c.subscribeChecks, st.SubscribeChecks)
	n(c.subscribeCheckQueries, st.SubscribeCheckQueries)
	n(c.inlineWrites, st.InlineWrites, "whole")
	n(c.inlineWrites, st.InlineLeftovers, "rest")
	for code, v := range st.Closes {
		n(c.closes, v, strconv.Itoa(code))
	}
	for reason, v := range st.Rejects {
		n(c.rejects, v, reason)
	}
	for reason, v := range st.RefreshRejects {
		n(c.refreshRejects, v, reason)
	}
}
