package main

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/han-app/gateway/internal/testenv"
)

// scrape parses the live /metrics of m.
func scrape(t *testing.T, m *Main) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricsScenario runs the service through enough traffic that every
// family has samples: sends (with a retry and a conflict), a project write
// and publish, a realtime subscription.
func metricsScenario(t *testing.T) (*Main, *scenario) {
	t.Helper()
	m := start(t, baseEnv())
	s := newScenario(t, m)
	s.send("m-1", "first body")
	// The retry is a Redis replay once the first send's record is
	// complete there (the request does not wait for that; a retry in the
	// gap is answered from PostgreSQL, outcome replay_pg).
	testenv.Eventually(t, 10*time.Second, func() bool {
		s.send("m-1", "first body")
		return hasLabelValue(scrape(t, m)["han_idempotency_requests_total"], "outcome", "replay")
	}, "no retry was answered from Redis")
	s.send("m-1", "another body")
	s.prj("PUT", "/cache", `{"key":"k","type":"string","value":"v"}`)
	s.publish("m-1", `{"a":1}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+m.Addr()+"/v1/realtime", &websocket.DialOptions{
		Subprotocols: []string{"han.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + s.bTok}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+s.dialog+`"}`))
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	// A message on the subscribed dialog reaches the socket (and the
	// delivery-latency histogram).
	if code, b := s.send("m-2", "after subscribe"); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"message.created"`) {
			break
		}
	}
	// A frame the protocol refuses: the server closes the socket with a code.
	_ = c.Write(ctx, websocket.MessageBinary, []byte{0xff})
	for {
		if _, _, err := c.Read(ctx); err != nil {
			break
		}
	}
	return m, s
}

// requiredFamilies are the metric families operators rely on (dashboards and
// alert rules query them), family by family.
var requiredFamilies = []string{
	"han_ratelimit_decisions_total",                   // rate-limit decisions by route and result
	"han_idempotency_requests_total",                  // idempotency hit / replay / conflict / fallback
	"han_ws_connections",                              // WebSocket connections
	"han_ws_subscriptions",                            // subscriptions
	"han_ws_queue_overflows_total",                    // queue overflows
	"han_ws_resyncs_total",                            // resyncs
	"han_ws_closes_total",                             // closes by code
	"han_pubsub_channels",                             // Pub/Sub subscribed channels
	"han_pubsub_reconnects_total",                     // Pub/Sub reconnects
	"han_pubsub_canary_lag_seconds",                   // canary lag
	"han_redis_client_recent_max_output_buffer_bytes", // output buffers from INFO clients
	"han_redis_connected_clients",
	"han_outbox_backlog",              // outbox backlog
	"han_outbox_relay_failures_total", // failed relay runs (PostgreSQL or Redis out)
	"han_postgres_up",                 // PostgreSQL reachability, read at scrape time
	"han_outbox_marks_total",          // delivered marks written in batches
	"han_outbox_purged_total",         // delivered rows purged after the retention
	"han_outbox_undelivered_past_retention",
	"han_dependency_errors_total",       // Redis and PostgreSQL errors by kind
	"han_redis_db0_degraded",            // degraded state
	"han_redis_up",                      // degraded state per database
	"han_pubsub_link_up",                // degraded state of the realtime link
	"han_project_writes_refused_total",  // project API writes refused by gate
	"han_delivery_latency_seconds",      // delivery latency histogram
	"han_http_request_duration_seconds", // request latency
	"han_http_connections_open",         // client connections under HAN_MAX_CONNECTIONS
	"han_redis_evicted_keys_total",      // eviction alarms
	"han_redis_memory_used_bytes",       //
	"han_redis_memory_max_bytes",        //
	"han_project_data_state_invalid_total",
	"han_build_info", // which build each instance runs
}

// /metrics exposes every family above, and metrics contain no secret,
// value or PII: after a scenario every required family is
// scraped, and every label is one of a small fixed set whose values are
// never an id, key, token or body.
func TestMetricsFamiliesAndBoundedLabels(t *testing.T) {
	m, s := metricsScenario(t)
	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 10*time.Second, func() bool {
		fams = scrape(t, m)
		_, ok := fams["han_ws_closes_total"]
		return ok
	}, "no han_ws_closes_total after a socket closed")
	var missing []string
	for _, f := range requiredFamilies {
		if _, ok := fams[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("/metrics lacks %v", missing)
	}
	// The upgrade's 101 leaves on the hijacked connection with the hello,
	// past the access log's writer: it is still counted as a 101.
	if n := counterValue(fams["han_http_requests_total"], map[string]string{"route": "/v1/realtime", "code": "101"}); n < 1 {
		t.Errorf("han_http_requests_total has no 101 for /v1/realtime")
	}
	for _, want := range []struct{ family, label string }{
		{"han_ratelimit_decisions_total", "route"}, {"han_ratelimit_decisions_total", "result"},
		{"han_idempotency_requests_total", "outcome"}, {"han_redis_up", "db"},
		{"han_project_writes_refused_total", "reason"},
	} {
		if !hasLabel(fams[want.family], want.label) {
			t.Errorf("%s has no %q label", want.family, want.label)
		}
	}

	if n := fams["han_delivery_latency_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n < 1 {
		t.Errorf("han_delivery_latency_seconds observed %d deliveries, want at least 1", n)
	}
	for _, outcome := range []string{"created", "replay", "conflict"} {
		if !hasLabelValue(fams["han_idempotency_requests_total"], "outcome", outcome) {
			t.Errorf("han_idempotency_requests_total has no outcome=%q after the scenario", outcome)
		}
	}

	// Bounded labels: names from an allow-list, values that are not ids,
	// and none of the scenario's secrets or identifiers.
	allowedLabels := []string{"route", "method", "code", "result", "dependency", "kind", "class", "reason",
		"db", "le", "quantile", "family", "event", "outcome", "version", "status", "mode", "scope", "op",
		"operation", "state", "type", "policy", "decision", "name", "source",
		"commit", "go_version"} // han_build_info: one value per process
	uuid := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	secrets := []string{s.aTok, s.bTok, s.alice, s.bob, s.dialog, s.project, s.topicID, "first body", "another body"}
	for name, f := range fams {
		if !strings.HasPrefix(name, "han_") {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if !slices.Contains(allowedLabels, lp.GetName()) {
					t.Errorf("%s: label %q is not on the bounded allow-list", name, lp.GetName())
				}
				v := lp.GetValue()
				if uuid.MatchString(v) || len(v) > 64 {
					t.Errorf("%s{%s=%q}: an unbounded value", name, lp.GetName(), v)
				}
				for _, sec := range secrets {
					if sec != "" && strings.Contains(v, sec) {
						t.Errorf("%s{%s=%q} carries scenario data", name, lp.GetName(), v)
					}
				}
			}
		}
	}
}

func hasLabel(f *dto.MetricFamily, label string) bool {
	for _, mt := range f.GetMetric() {
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == label {
				return true
			}
		}
	}
	return false
}

func hasLabelValue(f *dto.MetricFamily, label, value string) bool {
	for _, mt := range f.GetMetric() {
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value && mt.GetCounter().GetValue() > 0 {
				return true
			}
		}
	}
	return false
}

func counterValue(f *dto.MetricFamily, labels map[string]string) float64 {
	var sum float64
	for _, mt := range f.GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if match {
			sum += mt.GetCounter().GetValue() + mt.GetGauge().GetValue()
		}
	}
	return sum
}

// The project API's refusals and the dependency failures behind them are
// counted: writes under an unsafe eviction policy, a DB0 outage.
func TestMetricsCountRefusalsAndDependencyErrors(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	admin := r.AdminClient(0)
	err = admin.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err()
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, b := s.prj("PUT", "/cache", `{"key":"k","type":"string","value":"v"}`)
		if code == 503 && b == `{"error":"unsafe_eviction_policy"}` {
			refused++
			return true
		}
		return false
	}, "cache writes not refused under allkeys-lru")
	fams := scrape(t, m)
	if v := counterValue(fams["han_project_writes_refused_total"], map[string]string{"reason": "unsafe_eviction_policy"}); v != float64(refused) {
		t.Fatalf("writes refused by the gate: %v, want %d", v, refused)
	}
	if v := counterValue(fams["han_redis_up"], map[string]string{"db": "0"}); v != 1 {
		t.Fatalf("han_redis_up{db=0} = %v with Redis up", v)
	}
	r.Kill()
	if code, _ := s.send("dep-1", "x"); code != 503 {
		t.Fatalf("send with Redis down: %d", code)
	}
	fams = scrape(t, m)
	if v := counterValue(fams["han_dependency_errors_total"], map[string]string{"dependency": "redis", "kind": "unavailable"}); v < 1 {
		t.Fatalf("redis unavailable errors: %v", v)
	}
	// The Redis readings are shared for a second (metrics.go): a later
	// scrape sees Redis down.
	testenv.Eventually(t, 5*time.Second, func() bool {
		return counterValue(scrape(t, m)["han_redis_up"], map[string]string{"db": "0"}) == 0
	}, "han_redis_up{db=0} not 0 with Redis down")

}
