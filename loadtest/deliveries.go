package loadtest

import (
	"context"
	"sync/atomic"
	"time"
)

// Deliveries accounts for realtime events end to end: publishers report
// each accepted publish with the number of subscribers that should get it,
// connections report what they received (deduplicated per connection and
// dialog), and Finish turns the difference into loss. Latency is measured
// from each event's scheduled send time. Safe for concurrent use.
type Deliveries struct {
	reg           *Registry
	latency       *Trend
	received      *Counter
	duplicates    *Counter
	unexpected    *Counter
	other         *Counter
	publishFailed *Rate
	expected      atomic.Int64
	unique        atomic.Int64
}

// NewDeliveries records into reg's delivery_* metrics.
func NewDeliveries(reg *Registry) *Deliveries {
	return &Deliveries{
		reg: reg, latency: reg.Trend(MetricDeliveryLatency), received: reg.Counter(MetricDeliveryReceived),
		duplicates: reg.Counter(MetricDeliveryDuplicates), unexpected: reg.Counter(MetricDeliveryUnexpected),
		other:         reg.Counter(MetricWSEventsOther),
		publishFailed: reg.Rate(MetricPublishFailed),
	}
}

// Published records an accepted publish that subscribers connections
// should each receive once.
func (d *Deliveries) Published(subscribers int) {
	d.expected.Add(int64(subscribers))
	d.reg.Counter(MetricDeliveryExpected).Add(int64(subscribers))
	d.publishFailed.Add(false)
}

// PublishFailed records a publish the target refused or that failed; its
// event is not expected anywhere.
func (d *Deliveries) PublishFailed() { d.publishFailed.Add(true) }

// Expected and Received are the running totals.
func (d *Deliveries) Expected() int64 { return d.expected.Load() }

// Received is the number of unique deliveries so far.
func (d *Deliveries) Received() int64 { return d.unique.Load() }

// Drain waits until every expected delivery arrived, timeout passed or ctx
// ended; it reports whether everything arrived.
func (d *Deliveries) Drain(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for d.unique.Load() < d.expected.Load() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// Finish records delivery_lost, delivery_loss and delivery_rate (unique
// deliveries per second over measured).
func (d *Deliveries) Finish(measured time.Duration) {
	exp, got := d.expected.Load(), d.unique.Load()
	lost := max(exp-got, 0)
	d.reg.Counter(MetricDeliveryLost).Add(lost)
	if exp > 0 {
		d.reg.Rate(MetricDeliveryLoss).AddN(lost, exp)
	}
	if measured > 0 {
		d.reg.Gauge(MetricDeliveryRate, UnitPerSecond).Set(float64(got) / measured.Seconds())
	}
}
