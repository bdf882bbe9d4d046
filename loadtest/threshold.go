package loadtest

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// valueClass is the kind of unit a threshold's value was written in.
type valueClass int

const (
	classPlain valueClass = iota
	classDuration
	classPercent
	classBytes
)

// Threshold is one pass/fail criterion on a metric, written like
// `delivery_p99<150ms`, `http_req_failed<0.1%`, `ws_connect_p95<500ms`,
// `delivery_lost==0` or `server_mem_per_conn<10KiB`:
//
//	<metric>[_<aggregation>] <op> <number>[unit]
//
// metric is a metric name (or the aliases `delivery`, `ws_connect`),
// optionally with tags in braces (`http_req_duration{endpoint=POST /v1/dialogs}_p99<300ms`);
// aggregation is avg, min, med, max, pN (p99, p99.9), count, rate or value
// (default: count for counters, rate for rates, value for gauges; trends
// need one); op is <, <=, >, >=, == or !=; units are ns, us, µs, ms, s, m,
// h (a bare number on a trend means milliseconds, as in k6), % and
// B, KiB, MiB, GiB.
type Threshold struct {
	Expr  string // as written
	left  string // metric[_agg] as written
	Op    string
	Value float64 // in the metric's unit: ns, a fraction, bytes or a plain number
	class valueClass

	// Set by Bind.
	Metric string  // resolved full metric name
	Agg    string  // avg, min, med, max, p, count, rate, value
	P      float64 // percentile for Agg == "p"
	kind   Kind
}

var operators = []string{"<=", ">=", "==", "!=", "<", ">"}

// ParseThreshold checks the syntax of one expression. Metric names are
// resolved later by Bind, once the scenario has declared its metrics.
func ParseThreshold(expr string) (Threshold, error) {
	t := Threshold{Expr: strings.TrimSpace(expr)}
	if t.Expr == "" {
		return t, errors.New("threshold: empty expression")
	}
	depth, at := 0, -1
	for i := 0; i < len(t.Expr) && at < 0; i++ {
		switch c := t.Expr[i]; c {
		case '{':
			depth++
		case '}':
			depth--
		case '<', '>', '=', '!':
			if depth == 0 {
				at = i
			}
		}
	}
	if at <= 0 {
		return t, fmt.Errorf("threshold %q: want <metric>[_agg] <op> <value>, e.g. delivery_p99<150ms", t.Expr)
	}
	rest := t.Expr[at:]
	for _, op := range operators {
		if strings.HasPrefix(rest, op) {
			t.Op = op
			break
		}
	}
	if t.Op == "" {
		return t, fmt.Errorf("threshold %q: unknown operator (use <, <=, >, >=, ==, !=)", t.Expr)
	}
	t.left = strings.TrimSpace(t.Expr[:at])
	v, class, err := parseThresholdValue(strings.TrimSpace(rest[len(t.Op):]))
	if err != nil {
		return t, fmt.Errorf("threshold %q: %w", t.Expr, err)
	}
	t.Value, t.class = v, class
	return t, nil
}

// ParseThresholds parses every expression, joining the errors.
func ParseThresholds(exprs []string) ([]Threshold, error) {
	var out []Threshold
	var errs []error
	for _, e := range exprs {
		t, err := ParseThreshold(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

var durationUnits = []struct {
	suffix string
	d      time.Duration
}{{"ns", time.Nanosecond}, {"us", time.Microsecond}, {"µs", time.Microsecond}, {"ms", time.Millisecond},
	{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}}

var byteUnits = []struct {
	suffix string
	n      float64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}}

func parseThresholdValue(s string) (float64, valueClass, error) {
	num := s
	if i := strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("0123456789.+-eE", r) }); i >= 0 {
		num = s[:i]
	}
	unit := strings.TrimSpace(s[len(num):])
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, 0, fmt.Errorf("bad number %q", s)
	}
	switch unit {
	case "":
		return v, classPlain, nil
	case "%":
		return v / 100, classPercent, nil
	}
	for _, u := range byteUnits {
		if unit == u.suffix {
			return v * u.n, classBytes, nil
		}
	}
	for _, u := range durationUnits {
		if unit == u.suffix {
			return v * float64(u.d), classDuration, nil
		}
	}
	return 0, 0, fmt.Errorf("unknown unit %q (use ns, us, ms, s, m, h, %%, B, KiB, MiB, GiB)", unit)
}

// parseAgg recognises an aggregation suffix.
func parseAgg(s string) (agg string, p float64, ok bool) {
	switch s {
	case "avg", "min", "med", "max", "count", "rate", "value":
		return s, 0, true
	}
	if len(s) > 1 && s[0] == 'p' {
		v, err := strconv.ParseFloat(s[1:], 64)
		if err == nil && v > 0 && v <= 100 {
			return "p", v, true
		}
	}
	return "", 0, false
}

// Bind resolves the metric name against the registry and checks that the
// aggregation and the value's unit fit the metric's kind.
func (t *Threshold) Bind(r *Registry) error {
	name, kind, ok := r.kindOf(t.left)
	agg, p := "", 0.0
	if !ok {
		i := strings.LastIndexByte(t.left, '_')
		if j := strings.LastIndexByte(t.left, '}'); i < 0 || j > i {
			return fmt.Errorf("threshold %q: unknown metric %q", t.Expr, t.left)
		}
		var aggOK bool
		agg, p, aggOK = parseAgg(t.left[i+1:])
		if !aggOK {
			return fmt.Errorf("threshold %q: unknown metric %q", t.Expr, t.left)
		}
		name, kind, ok = r.kindOf(t.left[:i])
		if !ok {
			return fmt.Errorf("threshold %q: unknown metric %q", t.Expr, t.left[:i])
		}
	}
	unit := r.unitOf(name)
	allowed := map[Kind][]string{
		KindCounter: {"count", "rate"},
		KindGauge:   {"value", "min", "max"},
		KindTrend:   {"avg", "min", "med", "max", "p", "count"},
		KindRate:    {"rate", "count"},
	}[kind]
	if agg == "" {
		switch kind {
		case KindCounter:
			agg = "count"
		case KindGauge:
			agg = "value"
		case KindRate:
			agg = "rate"
		case KindTrend:
			return fmt.Errorf("threshold %q: %s is a trend: name an aggregation, e.g. %s_p99 or %s_avg", t.Expr, t.left, t.left, t.left)
		}
	}
	fits := false
	for _, a := range allowed {
		fits = fits || a == agg
	}
	if !fits {
		return fmt.Errorf("threshold %q: a %s has no %q aggregation (use %s)", t.Expr, kind, agg, strings.Join(allowed, ", "))
	}
	// Units: a duration only on trend timings, % only on fractions, bytes
	// only on byte gauges; a bare number on a trend timing is milliseconds.
	timing := kind == KindTrend && agg != "count"
	fraction := kind == KindRate && agg == "rate" || kind == KindGauge && unit == UnitRatio
	switch {
	case t.class == classDuration && !timing,
		t.class == classPercent && !fraction,
		t.class == classBytes && !(kind == KindGauge && unit == UnitBytes):
		return fmt.Errorf("threshold %q: the unit does not fit %s (%s %s)", t.Expr, name, kind, agg)
	case t.class == classPlain && timing:
		t.Value *= float64(time.Millisecond)
		t.class = classDuration
	}
	t.Metric, t.Agg, t.P, t.kind = name, agg, p, kind
	return nil
}

// ThresholdResult is a threshold evaluated against a snapshot.
type ThresholdResult struct {
	Expr     string  `json:"expr"`
	OK       bool    `json:"ok"`
	NoData   bool    `json:"noData,omitempty"`
	Observed float64 `json:"observed"` // in the metric's unit (ns for timings)
	// Shown is Observed rendered for people (12.3ms, 0.05%, 9.6KiB).
	Shown string `json:"shown"`
}

// Evaluate checks the bound threshold. A metric with no data fails: a
// smoke test that delivered nothing must not pass on silence. A counter
// is never without data: a tagged series nothing was counted in (e.g.
// errors{status=429,code=rate_limited} in a run without a 429) was simply
// never created, and reads 0.
func (t Threshold) Evaluate(s Snapshot) ThresholdResult {
	res := ThresholdResult{Expr: t.Expr}
	v, ok := s.Metrics[t.Metric]
	if !ok && t.kind == KindCounter {
		v, ok = MetricValue{Name: t.Metric, Kind: KindCounter}, true
	}
	if !ok || !v.HasData() {
		res.NoData, res.Shown = true, "no data"
		return res
	}
	var obs float64
	switch t.Agg {
	case "avg":
		obs = v.Avg
	case "min":
		obs = v.Min
	case "max":
		obs = v.Max
	case "med":
		obs = v.Percentile(50)
	case "p":
		obs = v.Percentile(t.P)
	case "count":
		obs = float64(v.Count)
	case "rate":
		obs = v.Rate
	case "value":
		obs = v.Value
	}
	res.Observed = obs
	res.Shown = t.shortAgg() + "=" + formatObserved(t, v, obs)
	switch t.Op {
	case "<":
		res.OK = obs < t.Value
	case "<=":
		res.OK = obs <= t.Value
	case ">":
		res.OK = obs > t.Value
	case ">=":
		res.OK = obs >= t.Value
	case "==":
		res.OK = obs == t.Value
	case "!=":
		res.OK = obs != t.Value
	}
	return res
}

func (t Threshold) shortAgg() string {
	if t.Agg == "p" {
		return "p(" + strconv.FormatFloat(t.P, 'f', -1, 64) + ")"
	}
	return t.Agg
}

func formatObserved(t Threshold, v MetricValue, obs float64) string {
	switch {
	case t.kind == KindTrend && t.Agg != "count":
		return formatDuration(obs)
	case t.kind == KindRate && t.Agg == "rate":
		return formatPercent(obs)
	case t.kind == KindCounter && t.Agg == "rate":
		return formatFloat(obs) + "/s"
	case t.kind == KindGauge:
		return formatUnit(obs, v.Unit)
	}
	return formatFloat(obs)
}

func (r *Registry) unitOf(name string) Unit {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.metrics[name]; ok {
		return m.unit
	}
	return UnitNone
}
