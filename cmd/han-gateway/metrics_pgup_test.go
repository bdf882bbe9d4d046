package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/testenv"
)

// scrapeWithin scrapes /metrics, failing when the answer takes longer than
// limit.
func scrapeWithin(t *testing.T, m *Main, limit time.Duration) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := (&http.Client{Timeout: limit}).Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatalf("/metrics within %v: %v", limit, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// PostgreSQL's reachability is scraped whatever the traffic, so an outage
// at a quiet hour can page (HanPostgresDown): han_postgres_up is 1 while
// PostgreSQL answers, 0 while it answers nothing (a partition: no error, no
// reply), and 1 again once it answers. Throughout, a scrape answers within
// a few seconds, the Redis databases still read as up, and the backlog
// PostgreSQL cannot count is left out rather than guessed.
func TestPostgresUpFollowsAnOutageWithoutTraffic(t *testing.T) {
	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	vars := baseEnv()
	vars["DATABASE_URL"] = proxied
	m := start(t, vars)
	const limit = 5 * time.Second // the probes' timeout is at most 1 s
	pgUp := func(fams map[string]*dto.MetricFamily) float64 {
		f := fams["han_postgres_up"]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("han_postgres_up: %v", f)
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	if fams := scrapeWithin(t, m, limit); pgUp(fams) != 1 || fams["han_outbox_backlog"] == nil {
		t.Fatalf("PostgreSQL answering: han_postgres_up=%v, han_outbox_backlog %v", pgUp(fams), fams["han_outbox_backlog"])
	}

	p.Blackhole(true)
	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 15*time.Second, func() bool {
		fams = scrapeWithin(t, m, limit)
		return pgUp(fams) == 0 && fams["han_outbox_backlog"] == nil
	}, "han_postgres_up not 0, or han_outbox_backlog still there, while PostgreSQL answers nothing")
	for _, db := range []string{"0", "1"} {
		if v := counterValue(fams["han_redis_up"], map[string]string{"db": db}); v != 1 {
			t.Errorf("han_redis_up{db=%s} = %v while only PostgreSQL is out", db, v)
		}
	}

	p.Blackhole(false)
	p.Cut()
	testenv.Eventually(t, 15*time.Second, func() bool {
		fams = scrapeWithin(t, m, limit)
		return pgUp(fams) == 1 && fams["han_outbox_backlog"] != nil
	}, "han_postgres_up not back to 1 once PostgreSQL answers")
}
