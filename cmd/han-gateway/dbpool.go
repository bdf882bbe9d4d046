package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/store"
)

// poolCollector reports the request pool's load at scrape time, so pool
// saturation shows in metrics rather than as a readiness failure: the
// connections in use and idle, the pool size, and the cumulative count and
// time of acquisitions that found no idle connection and had to wait.
type poolCollector struct {
	pool *pgxpool.Pool

	acquired, idle, total, max, waits, waitSeconds, canceled *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool) *poolCollector {
	return &poolCollector{pool: pool,
		acquired:    prometheus.NewDesc("han_db_pool_acquired_conns", "Request pool connections in use at scrape time.", nil, nil),
		idle:        prometheus.NewDesc("han_db_pool_idle_conns", "Request pool connections idle at scrape time.", nil, nil),
		total:       prometheus.NewDesc("han_db_pool_total_conns", "Request pool connections open (in use, idle or being opened).", nil, nil),
		max:         prometheus.NewDesc("han_db_pool_max_conns", "Request pool size limit.", nil, nil),
		waits:       prometheus.NewDesc("han_db_pool_empty_acquire_total", "Acquisitions that found no idle connection and waited.", nil, nil),
		waitSeconds: prometheus.NewDesc("han_db_pool_acquire_wait_seconds_total", "Time spent waiting for a connection by acquisitions that had to wait.", nil, nil),
		canceled:    prometheus.NewDesc("han_db_pool_canceled_acquire_total", "Acquisitions given up before a connection came free (request budget ran out or the client left).", nil, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.waits, c.waitSeconds, c.canceled} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(st.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(st.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(st.TotalConns()))
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(st.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(st.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitSeconds, prometheus.CounterValue, st.EmptyAcquireWaitTime().Seconds())
	ch <- prometheus.MustNewConstMetric(c.canceled, prometheus.CounterValue, float64(st.CanceledAcquireCount()))
}

// sendCollector exports what the send path wrote: transactions, and the
// dialog batches and sends they carried (sends ÷ transactions is how many
// sends share a commit).
type sendCollector struct {
	st                  *store.Store
	txs, batches, sends *prometheus.Desc
}

func newSendCollector(st *store.Store) *sendCollector {
	return &sendCollector{st: st,
		txs:     prometheus.NewDesc("han_send_transactions_total", "Send transactions written (a group of dialogs' batches, or one batch written again alone).", nil, nil),
		batches: prometheus.NewDesc("han_send_batches_total", "Dialog batches (one dialog's combined sends) carried by the send transactions.", nil, nil),
		sends:   prometheus.NewDesc("han_send_messages_total", "Sends carried by the send transactions.", nil, nil),
	}
}

func (c *sendCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.txs, c.batches, c.sends} {
		ch <- d
	}
}

func (c *sendCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.st.SendStats()
	ch <- prometheus.MustNewConstMetric(c.txs, prometheus.CounterValue, float64(st.Transactions))
	ch <- prometheus.MustNewConstMetric(c.batches, prometheus.CounterValue, float64(st.Batches))
	ch <- prometheus.MustNewConstMetric(c.sends, prometheus.CounterValue, float64(st.Sends))
}
