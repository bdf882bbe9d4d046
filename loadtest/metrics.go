package loadtest

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is the type of a metric, as in k6.
type Kind int

const (
	// KindCounter is a monotonically increasing count (aggregations: count, rate).
	KindCounter Kind = iota + 1
	// KindGauge is a last value with its extremes (aggregations: value, min, max).
	KindGauge
	// KindTrend is a distribution of durations (avg, min, med, max, p(N), count).
	KindTrend
	// KindRate is the fraction of samples that were true (rate, count).
	KindRate
)

func (k Kind) String() string {
	switch k {
	case KindCounter:
		return "counter"
	case KindGauge:
		return "gauge"
	case KindTrend:
		return "trend"
	case KindRate:
		return "rate"
	}
	return "unknown"
}

// Unit says how a gauge's value is rendered and which threshold units fit it.
type Unit int

const (
	// UnitNone is a plain number.
	UnitNone Unit = iota
	// UnitBytes renders as B/KiB/MiB and takes byte units in thresholds.
	UnitBytes
	// UnitRatio renders as a multiplier (0.93×).
	UnitRatio
	// UnitPerSecond renders as a rate (70000/s).
	UnitPerSecond
)

// Standard metric names. Scenarios record into them through the helpers of
// this package (WS dialer, API client, delivery tracker, executors).
const (
	MetricWSConnecting       = "ws_connecting"       // trend: WebSocket handshake duration
	MetricWSSessions         = "ws_sessions"         // counter: WebSocket sessions opened
	MetricWSMsgsReceived     = "ws_msgs_received"    // counter: WebSocket messages received
	MetricWSMsgsSent         = "ws_msgs_sent"        // counter: WebSocket messages sent
	MetricWSClosed           = "ws_closed"           // counter: sessions that ended before teardown
	MetricHTTPReqs           = "http_reqs"           // counter: HTTP requests made
	MetricHTTPReqDuration    = "http_req_duration"   // trend, also per endpoint {endpoint=METHOD template}
	MetricHTTPReqFailed      = "http_req_failed"     // rate: requests answered with an unexpected status or not at all
	MetricErrors             = "errors"              // counter, per {status=…,code=…}
	MetricDeliveryLatency    = "delivery_latency"    // trend: scheduled send → received, per subscriber
	MetricDeliveryExpected   = "delivery_expected"   // counter: accepted publishes × subscribers
	MetricDeliveryReceived   = "delivery_received"   // counter: unique deliveries
	MetricDeliveryLost       = "delivery_lost"       // counter: expected − unique received
	MetricDeliveryDuplicates = "delivery_duplicates" // counter: deliveries of an event a subscriber already had
	MetricDeliveryLoss       = "delivery_loss"       // rate: lost / expected
	MetricDeliveryUnexpected = "delivery_unexpected" // counter: events on a dialog the connection did not subscribe
	MetricWSEventsOther      = "ws_events_other"     // counter: events the load generator did not send (presence, typing, …)
	MetricDeliveryRate       = "delivery_rate"       // gauge: unique deliveries per second of the run
	MetricPublishFailed      = "publish_failed"      // rate: publishes the target refused or that failed
	MetricIterations         = "iterations"          // counter: executor iterations started
	MetricIterationDuration  = "iteration_duration"  // trend
	MetricDroppedIterations  = "dropped_iterations"  // counter: arrival-rate iterations with no free VU
	MetricVUs                = "vus"                 // gauge: active virtual users
)

// aliases are short names thresholds may use instead of the full metric
// names.
var aliases = map[string]string{
	"ws_connect": MetricWSConnecting,
	"delivery":   MetricDeliveryLatency,
}

// Counter is a monotonically increasing int64. Safe for concurrent use.
type Counter struct {
	v        atomic.Int64
	recorded atomic.Bool // Add or Inc was called, with 0 too
}

// Add adds n. Adding 0 records that the count was taken.
func (c *Counter) Add(n int64) {
	c.v.Add(n)
	if !c.recorded.Load() {
		c.recorded.Store(true)
	}
}

// Inc adds one.
func (c *Counter) Inc() { c.Add(1) }

// Recorded reports whether anything was added, 0 included.
func (c *Counter) Recorded() bool { return c.recorded.Load() }

// Value is the current count.
func (c *Counter) Value() int64 { return c.v.Load() }

// Gauge holds a float64 value and remembers its extremes. Safe for
// concurrent use.
type Gauge struct {
	mu        sync.Mutex // guards v, lo, hi, set
	v, lo, hi float64
	set       bool
}

// Set stores v.
func (g *Gauge) Set(v float64) {
	g.mu.Lock()
	g.setLocked(v)
	g.mu.Unlock()
}

func (g *Gauge) setLocked(v float64) {
	if !g.set || v < g.lo {
		g.lo = v
	}
	if !g.set || v > g.hi {
		g.hi = v
	}
	g.v, g.set = v, true
}

// Add adds d to the value.
func (g *Gauge) Add(d float64) {
	g.mu.Lock()
	g.setLocked(g.v + d)
	g.mu.Unlock()
}

// Value is the last value set (0 before any).
func (g *Gauge) Value() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.v
}

func (g *Gauge) read() (v, lo, hi float64, set bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.v, g.lo, g.hi, g.set
}

// Trend is a distribution of durations. Safe for concurrent use.
//
// Besides measured durations it counts dropped samples: iterations the
// arrival-rate schedule was due to start but could not (every VU busy),
// measured from their scheduled time. They never completed, so their
// latency is unbounded: they count as samples slower than any measured
// one. Percentiles rank over measured and dropped samples together, so a
// p99 "from schedule" is +Inf as soon as more than 1 % of the schedule was
// dropped and can never look better because the slowest iterations did not
// run; max and avg are +Inf when anything was dropped.
type Trend struct {
	h       *Histogram
	dropped atomic.Int64
}

// Add records one duration.
func (t *Trend) Add(d time.Duration) { t.h.Record(int64(d)) }

// AddDropped records n samples that never completed (dropped iterations):
// each is slower than any measured duration.
func (t *Trend) AddDropped(n int64) { t.dropped.Add(n) }

// Dropped is the number of samples recorded with AddDropped.
func (t *Trend) Dropped() int64 { return t.dropped.Load() }

// Histogram exposes the underlying histogram (nanoseconds).
func (t *Trend) Histogram() *Histogram { return t.h }

// Rate counts how many samples were true. Safe for concurrent use.
type Rate struct{ hits, total atomic.Int64 }

// Add records one sample.
func (r *Rate) Add(ok bool) {
	if ok {
		r.hits.Add(1)
	}
	r.total.Add(1)
}

// AddN records total samples of which hits were true.
func (r *Rate) AddN(hits, total int64) {
	r.hits.Add(hits)
	r.total.Add(total)
}

// Value is hits/total (0 with no samples) and the sample count.
func (r *Rate) Value() (float64, int64) {
	t := r.total.Load()
	if t == 0 {
		return 0, 0
	}
	return float64(r.hits.Load()) / float64(t), t
}

// Hits is the number of true samples.
func (r *Rate) Hits() int64 { return r.hits.Load() }

// metric is one registered series: a base name, optional tags and a value.
type metric struct {
	name string // full name: base or base{tags}
	base string
	kind Kind
	unit Unit
	// measured: a counter that holds a value only once its measurement
	// recorded into it (DeclareMeasured).
	measured bool
	c        *Counter
	g        *Gauge
	t        *Trend
	r        *Rate
}

// Registry holds the metrics of one run. Lookups take a mutex, so hot paths
// keep the returned pointer. Safe for concurrent use.
type Registry struct {
	mu      sync.Mutex
	metrics map[string]*metric // by full name; guarded by mu
	bases   map[string]Kind    // declared base names; guarded by mu
	start   time.Time          // guarded by mu
	stop    time.Time          // zero while the clock runs; guarded by mu
}

// NewRegistry returns a registry with every standard metric declared, so
// thresholds may name them before the first sample.
func NewRegistry() *Registry {
	r := &Registry{metrics: map[string]*metric{}, bases: map[string]Kind{}, start: time.Now()}
	for _, n := range []string{MetricWSSessions, MetricWSMsgsReceived, MetricWSMsgsSent, MetricWSClosed,
		MetricHTTPReqs, MetricErrors, MetricDeliveryExpected, MetricDeliveryReceived, MetricDeliveryLost,
		MetricDeliveryDuplicates, MetricDeliveryUnexpected, MetricWSEventsOther, MetricIterations, MetricDroppedIterations} {
		r.Counter(n)
	}
	for _, n := range []string{MetricWSConnecting, MetricHTTPReqDuration, MetricDeliveryLatency, MetricIterationDuration} {
		r.Trend(n)
	}
	for _, n := range []string{MetricHTTPReqFailed, MetricDeliveryLoss, MetricPublishFailed} {
		r.Rate(n)
	}
	r.Gauge(MetricVUs, UnitNone)
	r.Gauge(MetricWSOpen, UnitNone)
	r.Gauge(MetricDeliveryRate, UnitPerSecond)
	r.DeclareMeasured(MetricDeliveryLost, MetricDeliveryDuplicates)
	return r
}

// DeclareMeasured makes the named counters results of a measurement: each
// has no data (and fails every threshold) until the measurement records
// into it, 0 included. delivery_lost is 0 only when deliveries were
// expected and none went missing, not in a run that expected none.
func (r *Registry) DeclareMeasured(names ...string) {
	for _, n := range names {
		m := r.get(n, KindCounter, UnitNone)
		r.mu.Lock()
		m.measured = true
		r.mu.Unlock()
	}
}

// Tagged renders a sub-metric name: base{k1=v1,k2=v2} (pairs in the given
// order).
func Tagged(base string, kv ...string) string {
	if len(kv) == 0 {
		return base
	}
	var b strings.Builder
	b.WriteString(base)
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(kv[i+1])
	}
	b.WriteByte('}')
	return b.String()
}

// baseOf strips a {tags} suffix.
func baseOf(name string) string {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		return name[:i]
	}
	return name
}

func (r *Registry) get(name string, kind Kind, unit Unit) *metric {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.metrics[name]; ok {
		if m.kind != kind {
			panic(fmt.Sprintf("loadtest: metric %s is a %s, not a %s", name, m.kind, kind))
		}
		return m
	}
	base := baseOf(name)
	if k, ok := r.bases[base]; ok && k != kind {
		panic(fmt.Sprintf("loadtest: metric %s is a %s, not a %s", base, k, kind))
	}
	m := &metric{name: name, base: base, kind: kind, unit: unit}
	switch kind {
	case KindCounter:
		m.c = &Counter{}
	case KindGauge:
		m.g = &Gauge{}
	case KindTrend:
		m.t = &Trend{h: NewHistogram()}
	case KindRate:
		m.r = &Rate{}
	}
	r.metrics[name] = m
	r.bases[base] = kind
	return m
}

// Counter returns the counter called name (created on first use).
func (r *Registry) Counter(name string) *Counter { return r.get(name, KindCounter, UnitNone).c }

// Gauge returns the gauge called name (created on first use with unit).
func (r *Registry) Gauge(name string, unit Unit) *Gauge { return r.get(name, KindGauge, unit).g }

// Trend returns the trend called name (created on first use).
func (r *Registry) Trend(name string) *Trend { return r.get(name, KindTrend, UnitNone).t }

// Rate returns the rate called name (created on first use).
func (r *Registry) Rate(name string) *Rate { return r.get(name, KindRate, UnitNone).r }

// Elapsed is the run's clock: the time since the registry was created or
// ResetClock, up to StopClock.
func (r *Registry) Elapsed() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.elapsedLocked()
}

func (r *Registry) elapsedLocked() time.Duration {
	if !r.stop.IsZero() {
		return r.stop.Sub(r.start)
	}
	return time.Since(r.start)
}

// ResetClock restarts the run's clock when the measured phase begins, so
// per-second rates leave setup out.
func (r *Registry) ResetClock() {
	r.mu.Lock()
	r.start, r.stop = time.Now(), time.Time{}
	r.mu.Unlock()
}

// StopClock freezes the clock when the measured phase ends, so teardown
// does not dilute the rates.
func (r *Registry) StopClock() {
	r.mu.Lock()
	if r.stop.IsZero() {
		r.stop = time.Now()
	}
	r.mu.Unlock()
}

// kindOf reports the kind of a full or base metric name, resolving aliases.
func (r *Registry) kindOf(name string) (string, Kind, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := aliases[baseOf(name)]; ok {
		name = a + name[len(baseOf(name)):]
	}
	if m, ok := r.metrics[name]; ok {
		return name, m.kind, true
	}
	if name == baseOf(name) {
		if k, ok := r.bases[name]; ok {
			return name, k, true
		}
		return name, 0, false
	}
	// A tagged series not created yet: valid when its base is known.
	if !strings.HasSuffix(name, "}") {
		return name, 0, false
	}
	k, ok := r.bases[baseOf(name)]
	return name, k, ok
}

// Snapshot is a point-in-time copy of every metric, the input of thresholds
// and the summary.
type Snapshot struct {
	Elapsed time.Duration
	Metrics map[string]MetricValue
}

// MetricValue is one metric's aggregated values.
type MetricValue struct {
	Name string
	Kind Kind
	Unit Unit
	// Count: counter value, trend/rate sample count (for a trend, its
	// dropped samples included).
	Count int64
	// Dropped: trend samples that never completed (Trend.AddDropped),
	// counted in Count as slower than any measured one.
	Dropped int64
	// Rate: counter per second, or the rate's fraction.
	Rate float64
	// Value, Min, Max: gauge value and extremes; trend min/max in ns.
	Value, Min, Max float64
	// Trend only (nanoseconds).
	Avg         float64
	percentiles func(p float64) float64
	set         bool // gauge ever set
	unmeasured  bool // a measured counter nothing was recorded into
}

// Percentile is the trend's p-th percentile in nanoseconds.
func (v MetricValue) Percentile(p float64) float64 {
	if v.percentiles == nil {
		return 0
	}
	return v.percentiles(p)
}

// HasData reports whether the metric holds any sample.
func (v MetricValue) HasData() bool {
	switch v.Kind {
	case KindGauge:
		return v.set
	case KindCounter:
		// A counter at zero is a value ("no errors"), unless it is the
		// result of a measurement that never took place.
		return !v.unmeasured
	}
	return v.Count > 0
}

// Snapshot aggregates every metric now.
func (r *Registry) Snapshot() Snapshot {
	r.mu.Lock()
	ms := make([]*metric, 0, len(r.metrics))
	measured := map[*metric]bool{}
	for _, m := range r.metrics {
		ms = append(ms, m)
		measured[m] = m.measured
	}
	el := r.elapsedLocked()
	r.mu.Unlock()
	s := Snapshot{Elapsed: el, Metrics: make(map[string]MetricValue, len(ms))}
	secs := el.Seconds()
	for _, m := range ms {
		v := MetricValue{Name: m.name, Kind: m.kind, Unit: m.unit}
		switch m.kind {
		case KindCounter:
			v.Count = m.c.Value()
			v.Value = float64(v.Count)
			v.unmeasured = measured[m] && !m.c.Recorded()
			if secs > 0 {
				v.Rate = float64(v.Count) / secs
			}
		case KindGauge:
			v.Value, v.Min, v.Max, v.set = m.g.read()
		case KindTrend:
			v = trendValue(v, m.t)
		case KindRate:
			v.Rate, v.Count = m.r.Value()
			v.Value = float64(m.r.Hits())
		}
		s.Metrics[m.name] = v
	}
	return s
}

// trendValue aggregates t into v: the histogram's figures, with dropped
// samples as +Inf (slower than any measured one).
func trendValue(v MetricValue, t *Trend) MetricValue {
	h := t.h
	n, dropped := int64(h.Count()), t.Dropped()
	v.Count, v.Dropped = n+dropped, dropped
	v.Min, v.Max, v.Avg = float64(h.Min()), float64(h.Max()), h.Mean()
	if dropped > 0 {
		v.Max, v.Avg = math.Inf(1), math.Inf(1)
		if n == 0 {
			v.Min = math.Inf(1)
		}
	}
	lo := v.Min
	v.percentiles = func(p float64) float64 {
		switch {
		case dropped == 0:
			return float64(h.Percentile(p))
		case p <= 0:
			return lo
		case p >= 100:
			return math.Inf(1)
		}
		rank := max(int64(math.Ceil(p/100*float64(n+dropped))), 1)
		if rank > n {
			return math.Inf(1)
		}
		return float64(h.atRank(uint64(rank)))
	}
	return v
}

// Names lists the snapshot's metric names sorted, base metrics before
// their tagged series.
func (s Snapshot) Names() []string {
	out := make([]string, 0, len(s.Metrics))
	for n := range s.Metrics {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		bi, bj := baseOf(out[i]), baseOf(out[j])
		if bi != bj {
			return bi < bj
		}
		return out[i] < out[j]
	})
	return out
}
