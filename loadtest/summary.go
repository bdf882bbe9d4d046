package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Info is a named result a scenario reports besides its metrics (a ratio
// to the baseline, server memory per connection, a note).
type Info struct {
	Key   string
	Value any // string, int, int64, float64 or time.Duration
}

// Summary is the end-of-test report: every metric, every threshold's
// verdict and the scenario's own results.
type Summary struct {
	Scenario   string
	Target     string
	Started    time.Time
	Snapshot   Snapshot
	Thresholds []ThresholdResult
	Info       []Info
	// Err is the scenario's failure, if it stopped early.
	Err error
}

// Passed reports whether the run finished and every threshold held.
func (s *Summary) Passed() bool { return s.Err == nil && s.ThresholdsPassed() }

// ThresholdsPassed reports whether every threshold held.
func (s *Summary) ThresholdsPassed() bool {
	for _, t := range s.Thresholds {
		if !t.OK {
			return false
		}
	}
	return true
}

// trendPercentiles are the percentiles every trend reports.
var trendPercentiles = []float64{50, 90, 95, 99}

// WriteText renders the summary the way k6 does: thresholds with ✓/✗, then
// one dotted line per metric that has data.
func (s *Summary) WriteText(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n  scenario: %s   target: %s   measured: %s\n", s.Scenario, s.Target, s.Snapshot.Elapsed.Round(time.Millisecond))
	if len(s.Thresholds) > 0 {
		b.WriteString("\n")
		for _, t := range s.Thresholds {
			mark := "✓"
			if !t.OK {
				mark = "✗"
			}
			fmt.Fprintf(&b, "  %s %s %s\n", mark, dotted(t.Expr, 40), t.Shown)
		}
	}
	b.WriteString("\n")
	for _, name := range s.Snapshot.Names() {
		v := s.Snapshot.Metrics[name]
		line := metricLine(v)
		if line == "" {
			continue
		}
		fmt.Fprintf(&b, "    %s: %s\n", dotted(name, 44), line)
	}
	if len(s.Info) > 0 {
		b.WriteString("\n")
		for _, in := range s.Info {
			fmt.Fprintf(&b, "    %s: %s\n", dotted(in.Key, 44), formatInfo(in.Value))
		}
	}
	if s.Err != nil {
		fmt.Fprintf(&b, "\n  error: %v\n", s.Err)
	}
	verdict := "passed"
	if !s.Passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "\n  result: %s\n", verdict)
	_, _ = io.WriteString(w, b.String())
}

func dotted(s string, width int) string {
	if n := width - len([]rune(s)); n > 0 {
		return s + strings.Repeat(".", n)
	}
	return s
}

// metricLine renders one metric, or "" when it holds nothing worth a line
// (a trend or rate with no samples, a counter at zero, an unset gauge).
func metricLine(v MetricValue) string {
	switch v.Kind {
	case KindCounter:
		if v.Count == 0 {
			return ""
		}
		return fmt.Sprintf("%-10d %s/s", v.Count, formatFloat(v.Rate))
	case KindGauge:
		if !v.set {
			return ""
		}
		if v.Min == v.Max {
			return formatUnit(v.Value, v.Unit)
		}
		return fmt.Sprintf("%-10s min=%s max=%s", formatUnit(v.Value, v.Unit), formatUnit(v.Min, v.Unit), formatUnit(v.Max, v.Unit))
	case KindTrend:
		if v.Count == 0 {
			return ""
		}
		parts := []string{"avg=" + formatDuration(v.Avg), "min=" + formatDuration(v.Min)}
		for _, p := range trendPercentiles {
			label := "p(" + strconv.FormatFloat(p, 'f', -1, 64) + ")"
			if p == 50 {
				label = "med"
			}
			parts = append(parts, label+"="+formatDuration(v.Percentile(p)))
		}
		parts = append(parts, "max="+formatDuration(v.Max), "count="+strconv.FormatInt(v.Count, 10))
		if v.Dropped > 0 {
			// Dropped iterations are in count and rank above every
			// measured sample (∞): say how many.
			parts = append(parts, "dropped="+strconv.FormatInt(v.Dropped, 10))
		}
		return strings.Join(parts, " ")
	case KindRate:
		if v.Count == 0 {
			return ""
		}
		return fmt.Sprintf("%-10s ✓ %d ✗ %d", formatPercent(v.Rate), int64(v.Value), v.Count-int64(v.Value))
	}
	return ""
}

// formatDuration renders nanoseconds with three significant digits; the
// unbounded latency of a dropped iteration is ∞.
func formatDuration(ns float64) string {
	switch a := math.Abs(ns); {
	case math.IsInf(ns, 1):
		return "∞"
	case a >= float64(time.Second):
		return formatFloat(ns/float64(time.Second)) + "s"
	case a >= float64(time.Millisecond):
		return formatFloat(ns/float64(time.Millisecond)) + "ms"
	case a >= float64(time.Microsecond):
		return formatFloat(ns/float64(time.Microsecond)) + "µs"
	}
	return formatFloat(ns) + "ns"
}

func formatPercent(f float64) string { return formatFloat(f*100) + "%" }

// formatFloat prints up to three decimals, no trailing zeros.
func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	prec := 3
	if math.Abs(f) >= 100 {
		prec = 1
	}
	return strconv.FormatFloat(f, 'f', prec, 64)
}

func formatUnit(v float64, u Unit) string {
	switch u {
	case UnitBytes:
		switch a := math.Abs(v); {
		case a >= 1<<30:
			return formatFloat(v/(1<<30)) + "GiB"
		case a >= 1<<20:
			return formatFloat(v/(1<<20)) + "MiB"
		case a >= 1<<10:
			return formatFloat(v/(1<<10)) + "KiB"
		}
		return formatFloat(v) + "B"
	case UnitRatio:
		return formatFloat(v) + "×"
	case UnitPerSecond:
		return formatFloat(v) + "/s"
	}
	return formatFloat(v)
}

func formatInfo(v any) string {
	switch x := v.(type) {
	case time.Duration:
		return formatDuration(float64(x))
	case float64:
		return formatFloat(x)
	}
	return fmt.Sprint(v)
}

// exportedMetric is one metric in the --summary-export JSON (k6's layout:
// timings in milliseconds).
type exportedMetric struct {
	Type   string               `json:"type"`
	Values map[string]jsonFloat `json:"values"`
}

// jsonFloat is a number of the export. JSON has no infinity, so the
// unbounded latency of dropped iterations is written as the string "+Inf"
// (as Go and Prometheus spell it): a reader comparing it as a number fails
// or, as jq does, orders it above every number, never below a limit.
type jsonFloat float64

// MarshalJSON implements json.Marshaler.
func (f jsonFloat) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(f), 1) {
		return []byte(`"+Inf"`), nil
	}
	return json.Marshal(float64(f))
}

// exportedThreshold is a ThresholdResult in the export, its observed
// value a jsonFloat.
type exportedThreshold struct {
	Expr     string    `json:"expr"`
	OK       bool      `json:"ok"`
	NoData   bool      `json:"noData,omitempty"`
	Observed jsonFloat `json:"observed"`
	Shown    string    `json:"shown"`
}

type exportedSummary struct {
	Scenario   string                    `json:"scenario"`
	Target     string                    `json:"target"`
	StartedAt  int64                     `json:"startedAt"` // epoch milliseconds
	DurationMs float64                   `json:"durationMs"`
	Passed     bool                      `json:"passed"`
	Error      string                    `json:"error,omitempty"`
	Metrics    map[string]exportedMetric `json:"metrics"`
	Thresholds []exportedThreshold       `json:"thresholds"`
	Info       map[string]any            `json:"info"`
}

// WriteJSON writes the machine-readable summary (--summary-export).
func (s *Summary) WriteJSON(w io.Writer) error {
	out := exportedSummary{
		Scenario: s.Scenario, Target: s.Target, StartedAt: s.Started.UnixMilli(),
		DurationMs: ms(float64(s.Snapshot.Elapsed)), Passed: s.Passed(),
		Metrics: map[string]exportedMetric{}, Thresholds: []exportedThreshold{}, Info: map[string]any{},
	}
	for _, t := range s.Thresholds {
		out.Thresholds = append(out.Thresholds, exportedThreshold{Expr: t.Expr, OK: t.OK, NoData: t.NoData,
			Observed: jsonFloat(t.Observed), Shown: t.Shown})
	}
	if s.Err != nil {
		out.Error = s.Err.Error()
	}
	for name, v := range s.Snapshot.Metrics {
		if !v.HasData() {
			continue
		}
		out.Metrics[name] = exportMetric(v)
	}
	for _, in := range s.Info {
		switch x := in.Value.(type) {
		case time.Duration:
			out.Info[in.Key] = ms(float64(x))
		default:
			out.Info[in.Key] = x
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// exportMetric is v in k6's layout; a trend with dropped samples also
// gives their number as "dropped".
func exportMetric(v MetricValue) exportedMetric {
	vals := map[string]float64{}
	switch v.Kind {
	case KindCounter:
		vals["count"], vals["rate"] = float64(v.Count), v.Rate
	case KindGauge:
		vals["value"], vals["min"], vals["max"] = v.Value, v.Min, v.Max
	case KindTrend:
		vals["avg"], vals["min"], vals["max"] = ms(v.Avg), ms(v.Min), ms(v.Max)
		vals["count"] = float64(v.Count)
		if v.Dropped > 0 {
			vals["dropped"] = float64(v.Dropped)
		}
		for _, p := range trendPercentiles {
			key := "p(" + strconv.FormatFloat(p, 'f', -1, 64) + ")"
			if p == 50 {
				key = "med"
			}
			vals[key] = ms(v.Percentile(p))
		}
	case KindRate:
		vals["rate"], vals["passes"], vals["fails"] = v.Rate, v.Value, float64(v.Count)-v.Value
	}
	m := exportedMetric{Type: v.Kind.String(), Values: make(map[string]jsonFloat, len(vals))}
	for k, x := range vals {
		m.Values[k] = jsonFloat(x)
	}
	return m
}

func ms(ns float64) float64 { return ns / float64(time.Millisecond) }
