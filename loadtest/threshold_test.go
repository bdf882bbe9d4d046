package loadtest_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest"
)

func TestParseThresholdSyntax(t *testing.T) {
	for _, c := range []struct {
		expr  string
		op    string
		value float64
	}{
		{"delivery_p99<150ms", "<", 150e6},
		{"http_req_failed<0.1%", "<", 0.001},
		{"ws_connect_p95<500ms", "<", 500e6},
		{" delivery_lost == 0 ", "==", 0},
		{"delivery_rate>=84000", ">=", 84000},
		{"server_mem_per_conn<10KiB", "<", 10240},
		{"x_p99.9<=1.5s", "<=", 1.5e9},
		{"x_max!=2us", "!=", 2000},
		{"http_req_duration{endpoint=POST /v1/dialogs/{id}/messages}_p99<300ms", "<", 300e6},
		{"x>1e3", ">", 1000},
	} {
		th, err := loadtest.ParseThreshold(c.expr)
		if err != nil {
			t.Errorf("%q: %v", c.expr, err)
			continue
		}
		if th.Op != c.op || th.Value != c.value {
			t.Errorf("%q: op %q value %v, want %q %v", c.expr, th.Op, th.Value, c.op, c.value)
		}
	}
	for _, bad := range []string{"", "delivery_p99", "<150ms", "delivery_p99<", "delivery_p99<fast",
		"delivery_p99<150parsecs", "delivery_p99=>1", "x<NaN", "x<Inf"} {
		if _, err := loadtest.ParseThreshold(bad); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		}
	}
}

func TestThresholdBindResolvesNamesAndChecksUnits(t *testing.T) {
	reg := loadtest.NewRegistry()
	reg.Gauge("server_mem_per_conn", loadtest.UnitBytes)
	reg.Gauge("baseline_ratio", loadtest.UnitRatio)
	reg.Trend(loadtest.Tagged(loadtest.MetricHTTPReqDuration, "endpoint", "POST /v1/dialogs/{id}/messages"))
	ok := map[string][2]string{ // expr → resolved metric, aggregation
		"delivery_p99<150ms":                     {loadtest.MetricDeliveryLatency, "p"},
		"ws_connect_p95<500ms":                   {loadtest.MetricWSConnecting, "p"},
		"http_req_failed<0.1%":                   {loadtest.MetricHTTPReqFailed, "rate"},
		"delivery_lost==0":                       {loadtest.MetricDeliveryLost, "count"},
		"delivery_rate>1000":                     {loadtest.MetricDeliveryRate, "value"},
		"errors_rate<1":                          {loadtest.MetricErrors, "rate"},
		"server_mem_per_conn<10KiB":              {"server_mem_per_conn", "value"},
		"baseline_ratio>=85%":                    {"baseline_ratio", "value"},
		"delivery_latency_avg<20":                {loadtest.MetricDeliveryLatency, "avg"},
		"errors{status=429,code=rate_limited}<5": {"errors{status=429,code=rate_limited}", "count"},
		"http_req_duration{endpoint=POST /v1/dialogs/{id}/messages}_p99<300ms": {
			"http_req_duration{endpoint=POST /v1/dialogs/{id}/messages}", "p"},
	}
	for expr, want := range ok {
		th, err := loadtest.ParseThreshold(expr)
		if err == nil {
			err = th.Bind(reg)
		}
		if err != nil {
			t.Errorf("%q: %v", expr, err)
			continue
		}
		if th.Metric != want[0] || th.Agg != want[1] {
			t.Errorf("%q: bound to %s/%s, want %s/%s", expr, th.Metric, th.Agg, want[0], want[1])
		}
	}
	// A bare number on a trend timing is milliseconds (k6).
	th, _ := loadtest.ParseThreshold("delivery_latency_avg<20")
	_ = th.Bind(reg)
	if th.Value != 20e6 {
		t.Errorf("bare trend value = %v ns, want 20ms", th.Value)
	}
	for _, bad := range []string{
		"nosuchmetric<1", "delivery<150ms" /* trend without aggregation */, "delivery_rate<5ms",
		"http_req_failed<5ms", "delivery_p99<5%", "delivery_lost<1KiB", "delivery_p0<1ms", "delivery_p101<1ms",
		"ws_sessions_p99<1", "http_req_failed_avg<1", "server_mem_per_conn_p99<1KiB",
	} {
		th, err := loadtest.ParseThreshold(bad)
		if err != nil {
			continue
		}
		if err := th.Bind(reg); err == nil {
			t.Errorf("%q: bound to %s/%s, want an error", bad, th.Metric, th.Agg)
		}
	}
}

func evalAll(t *testing.T, reg *loadtest.Registry, exprs ...string) map[string]loadtest.ThresholdResult {
	t.Helper()
	ths, err := loadtest.ParseThresholds(exprs)
	if err != nil {
		t.Fatal(err)
	}
	snap := reg.Snapshot()
	out := map[string]loadtest.ThresholdResult{}
	for _, th := range ths {
		if err := th.Bind(reg); err != nil {
			t.Fatal(err)
		}
		out[th.Expr] = th.Evaluate(snap)
	}
	return out
}

func TestThresholdEvaluation(t *testing.T) {
	reg := loadtest.NewRegistry()
	lat := reg.Trend(loadtest.MetricDeliveryLatency)
	for i := 1; i <= 1000; i++ {
		lat.Add(time.Duration(i) * time.Millisecond / 10) // 0.1ms … 100ms
	}
	failed := reg.Rate(loadtest.MetricHTTPReqFailed)
	failed.AddN(1, 2000) // 0.05 %
	reg.Counter(loadtest.MetricDeliveryLost).Add(3)
	mem := reg.Gauge("server_mem_per_conn", loadtest.UnitBytes)
	mem.Set(9 * 1024)

	res := evalAll(t, reg,
		"delivery_p99<150ms", "delivery_p99<50ms", "delivery_max<=100ms", "delivery_med>49ms",
		"http_req_failed<0.1%", "http_req_failed<0.01%", "delivery_lost==0", "delivery_lost<=3",
		"server_mem_per_conn<10KiB", "server_mem_per_conn<8KiB", "ws_connect_p95<500ms", "publish_failed<1%",
		"ws_sessions==0")
	want := map[string]bool{
		"delivery_p99<150ms": true, "delivery_p99<50ms": false, "delivery_max<=100ms": true, "delivery_med>49ms": true,
		"http_req_failed<0.1%": true, "http_req_failed<0.01%": false, "delivery_lost==0": false, "delivery_lost<=3": true,
		"server_mem_per_conn<10KiB": true, "server_mem_per_conn<8KiB": false,
		// No sample at all fails: a smoke run that delivered nothing must not pass.
		"ws_connect_p95<500ms": false, "publish_failed<1%": false,
		// A counter at zero is data.
		"ws_sessions==0": true,
	}
	for expr, ok := range want {
		if res[expr].OK != ok {
			t.Errorf("%s: ok=%v (%s), want %v", expr, res[expr].OK, res[expr].Shown, ok)
		}
	}
	if !res["ws_connect_p95<500ms"].NoData {
		t.Error("a trend with no samples must be reported as no data")
	}
	if got := res["delivery_p99<150ms"].Shown; !strings.HasPrefix(got, "p(99)=98.") && !strings.HasPrefix(got, "p(99)=99") {
		t.Errorf("shown = %q", got)
	}
}

// A tagged series of a counter exists only once something was counted in
// it: a clean run (no 429 at all) must pass the documented
// errors{status=429,code=rate_limited}<5, not fail it as "no data", and a
// run with 429s must be judged on their count.
func TestThresholdOnATaggedCounterNeverCountedReadsZero(t *testing.T) {
	const expr = "errors{status=429,code=rate_limited}<5"
	reg := loadtest.NewRegistry()
	res := evalAll(t, reg, expr, "errors{status=429,code=rate_limited}_rate<1", "errors{status=429,code=rate_limited}>0")
	if r := res[expr]; !r.OK || r.NoData || r.Shown != "count=0" {
		t.Errorf("%s on a clean run: %+v, want ok with count=0", expr, r)
	}
	if r := res["errors{status=429,code=rate_limited}_rate<1"]; !r.OK {
		t.Errorf("the rate of a counter never counted: %+v, want ok", r)
	}
	if r := res["errors{status=429,code=rate_limited}>0"]; r.OK {
		t.Errorf("a counter never counted is above 0: %+v", r)
	}
	reg.Counter(loadtest.Tagged(loadtest.MetricErrors, "status", "429", "code", "rate_limited")).Add(7)
	if r := evalAll(t, reg, expr)[expr]; r.OK || r.Observed != 7 {
		t.Errorf("%s with 7 counted: %+v, want failed at 7", expr, r)
	}
}

func TestSummaryTextAndJSON(t *testing.T) {
	reg := loadtest.NewRegistry()
	reg.Trend(loadtest.MetricDeliveryLatency).Add(2 * time.Millisecond)
	reg.Counter(loadtest.MetricDeliveryReceived).Add(10)
	reg.Rate(loadtest.MetricHTTPReqFailed).AddN(0, 4)
	ths, _ := loadtest.ParseThresholds([]string{"delivery_p99<1ms", "delivery_received>5"})
	sum := &loadtest.Summary{Scenario: "broadcast", Target: "http://127.0.0.1:1", Started: time.Now(), Snapshot: reg.Snapshot()}
	for _, th := range ths {
		if err := th.Bind(reg); err != nil {
			t.Fatal(err)
		}
		sum.Thresholds = append(sum.Thresholds, th.Evaluate(sum.Snapshot))
	}
	sum.Info = append(sum.Info, loadtest.Info{Key: "baseline_ratio", Value: 0.91})
	if sum.Passed() {
		t.Fatal("a failed threshold must fail the summary")
	}
	var text bytes.Buffer
	sum.WriteText(&text)
	for _, want := range []string{"✗ delivery_p99<1ms", "✓ delivery_received>5", "delivery_latency", "p(99)=2ms",
		"http_req_failed", "0% ", "baseline_ratio", "result: FAILED"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary text lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), loadtest.MetricWSConnecting) {
		t.Error("a metric with no data must not be listed")
	}
	var buf bytes.Buffer
	if err := sum.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Passed  bool `json:"passed"`
		Metrics map[string]struct {
			Type   string             `json:"type"`
			Values map[string]float64 `json:"values"`
		} `json:"metrics"`
		Thresholds []loadtest.ThresholdResult `json:"thresholds"`
		Info       map[string]any             `json:"info"`
	}
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	d := out.Metrics[loadtest.MetricDeliveryLatency]
	if out.Passed || d.Type != "trend" || d.Values["p(99)"] != 2 || d.Values["count"] != 1 {
		t.Fatalf("export = %s", buf.String())
	}
	if out.Metrics[loadtest.MetricDeliveryReceived].Values["count"] != 10 || len(out.Thresholds) != 2 || out.Info["baseline_ratio"] != 0.91 {
		t.Fatalf("export = %s", buf.String())
	}
}

// The delivery and loss counters judge a measurement: a run that expected
// no delivery at all (every publish failed, a send-only run, a scenario
// without sockets) has measured no loss and no duplicate, so
// delivery_lost==0 and delivery_duplicates==0 must fail as "no data", not
// pass on silence. Once something was expected, zero is a result.
func TestDeliveryThresholdsFailWhenNothingWasExpected(t *testing.T) {
	exprs := []string{"delivery_lost==0", "delivery_duplicates==0"}
	for name, reg := range map[string]*loadtest.Registry{"never finished": loadtest.NewRegistry(), "finished": loadtest.NewRegistry()} {
		if name == "finished" {
			dl := loadtest.NewDeliveries(reg)
			dl.PublishFailed()
			dl.Finish(time.Second)
		}
		for expr, r := range evalAll(t, reg, exprs...) {
			if r.OK || !r.NoData {
				t.Errorf("%s, %s with nothing expected: %+v, want failed as no data", name, expr, r)
			}
		}
	}
	reg := loadtest.NewRegistry()
	dl := loadtest.NewDeliveries(reg)
	dl.Published("d", 1, 0) // an event nobody subscribed: nothing expected
	dl.Finish(time.Second)
	if r := evalAll(t, reg, "delivery_lost==0")["delivery_lost==0"]; r.OK {
		t.Errorf("delivery_lost==0 with no delivery expected: %+v, want failed", r)
	}
	reg = loadtest.NewRegistry()
	dl = loadtest.NewDeliveries(reg)
	dl.Published("d", 1, 1)
	dl.Finish(time.Second)
	res := evalAll(t, reg, "delivery_lost==1", "delivery_duplicates==0")
	for expr, r := range res {
		if !r.OK {
			t.Errorf("%s after one expected delivery that never came: %+v, want ok", expr, r)
		}
	}
}

// A dropped iteration never completed: in a trend measured from schedule
// it ranks above every measured sample. Percentiles whose rank reaches the
// dropped samples, max and avg are +Inf; the others shift up as they would
// with the slowest samples in place; the summary shows ∞ and how many were
// dropped, and the export writes "+Inf" (JSON has no infinity).
func TestDroppedSamplesRankAboveEveryMeasuredOne(t *testing.T) {
	reg := loadtest.NewRegistry()
	lat := reg.Trend(loadtest.MetricDeliveryLatency)
	for i := 1; i <= 98; i++ {
		lat.Add(time.Duration(i) * time.Millisecond)
	}
	lat.AddDropped(2)
	v := reg.Snapshot().Metrics[loadtest.MetricDeliveryLatency]
	if v.Count != 100 || v.Dropped != 2 {
		t.Fatalf("count %d dropped %d, want 100 and 2", v.Count, v.Dropped)
	}
	if got := v.Percentile(98); math.Abs(got-float64(98*time.Millisecond)) > loadtest.MaxRelativeError*float64(98*time.Millisecond) {
		t.Errorf("p98 = %v, want the slowest measured sample, 98ms", time.Duration(got))
	}
	for _, p := range []float64{99, 100} {
		if got := v.Percentile(p); !math.IsInf(got, 1) {
			t.Errorf("p%v = %v, want +Inf: its rank falls on a dropped sample", p, time.Duration(got))
		}
	}
	if !math.IsInf(v.Max, 1) || !math.IsInf(v.Avg, 1) || v.Min != float64(time.Millisecond) {
		t.Errorf("min %v max %v avg %v, want 1ms, +Inf, +Inf", v.Min, v.Max, v.Avg)
	}

	ths, _ := loadtest.ParseThresholds([]string{"delivery_p98<99ms", "delivery_p99<1h", "delivery_max<1h"})
	sum := &loadtest.Summary{Scenario: "broadcast", Started: time.Now(), Snapshot: reg.Snapshot()}
	for _, th := range ths {
		if err := th.Bind(reg); err != nil {
			t.Fatal(err)
		}
		sum.Thresholds = append(sum.Thresholds, th.Evaluate(sum.Snapshot))
	}
	if r := sum.Thresholds; !r[0].OK || r[1].OK || r[2].OK || r[1].Shown != "p(99)=∞" {
		t.Errorf("thresholds %+v: want p98 passed, p99 and max failed at ∞", r)
	}
	var text bytes.Buffer
	sum.WriteText(&text)
	for _, want := range []string{"p(99)=∞", "max=∞", "count=100 dropped=2", "✗ delivery_p99<1h"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary text lacks %q:\n%s", want, text.String())
		}
	}
	var buf bytes.Buffer
	if err := sum.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Metrics map[string]struct {
			Values map[string]any `json:"values"`
		} `json:"metrics"`
		Thresholds []struct {
			Observed any `json:"observed"`
		} `json:"thresholds"`
	}
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	d := out.Metrics[loadtest.MetricDeliveryLatency].Values
	if p95, _ := d["p(95)"].(float64); d["p(99)"] != "+Inf" || d["max"] != "+Inf" || d["dropped"] != 2.0 || d["count"] != 100.0 ||
		math.Abs(p95-95) > loadtest.MaxRelativeError*95 {
		t.Errorf("export = %s", buf.String())
	}
	if out.Thresholds[1].Observed != "+Inf" {
		t.Errorf("threshold observed %v, want \"+Inf\"", out.Thresholds[1].Observed)
	}
}

// A trend with nothing but dropped samples has data, all of it unbounded.
func TestOnlyDroppedSamplesAreUnbounded(t *testing.T) {
	reg := loadtest.NewRegistry()
	reg.Trend(loadtest.MetricDeliveryLatency).AddDropped(3)
	th, _ := loadtest.ParseThreshold("delivery_p50<1h")
	if err := th.Bind(reg); err != nil {
		t.Fatal(err)
	}
	r := th.Evaluate(reg.Snapshot())
	if r.OK || r.NoData || !math.IsInf(r.Observed, 1) {
		t.Errorf("%+v, want failed with +Inf", r)
	}
}
