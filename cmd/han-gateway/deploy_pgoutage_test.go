package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// quietHourSeries are 30 minutes, at 30 s steps, of two instances nobody
// uses: Redis and Pub/Sub fine, request counters flat. pgDownAt is the step
// from which PostgreSQL is unreachable (none when 60): its ping fails, the
// backlog can no longer be counted (the series ends) and the relay fails
// each run.
func quietHourSeries(pgDownAt int) []map[string]string {
	up, backlog, relay := "1x60", "0x60", "0x60"
	if pgDownAt < 60 {
		before, after := strconv.Itoa(pgDownAt), strconv.Itoa(60-pgDownAt)
		up = "1x" + before + " 0x" + after
		backlog = "0x" + before + " stale" // gone from the scrape: Prometheus marks it stale
		relay = "0x" + before + " 1+1x" + after
	}
	var out []map[string]string
	add := func(series, values string) {
		out = append(out, map[string]string{"series": series, "values": values})
	}
	for _, inst := range []string{"gw1", "gw2"} {
		l := `instance="` + inst + `"`
		add(`han_redis_up{`+l+`,db="0"}`, "1x60")
		add(`han_redis_up{`+l+`,db="1"}`, "1x60")
		add(`han_redis_db0_degraded{`+l+`}`, "0x60")
		add(`han_pubsub_link_up{`+l+`}`, "1x60")
		add(`han_http_requests_total{`+l+`,route="GET /v1/me",code="200"}`, "40x60")
		add(`han_build_info{`+l+`,version="v",commit="c",go_version="go"}`, "1x60")
		add(`han_postgres_up{`+l+`}`, up)
		add(`han_outbox_backlog{`+l+`}`, backlog)
		add(`han_outbox_relay_failures_total{`+l+`}`, relay)
	}
	return out
}

// PostgreSQL down at a quiet hour raises alerts although no request fails
// (none arrives, so HanDependencyErrors and HanHTTP5xxRatio stay silent):
// 20 minutes into the outage exactly HanPostgresDown and
// HanOutboxRelayFailing fire, on both instances, and every other alert of
// deploy/prometheus-alerts.yml is silent. The same quiet hour with
// PostgreSQL up raises no alert at all.
func TestPostgresOutageRaisesAnAlert(t *testing.T) {
	pt := promtool(t)
	rules := readRules(t, "prometheus-alerts.yml")
	annotations := map[string]map[string]string{}
	labels := map[string]map[string]string{}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			annotations[r.Alert], labels[r.Alert] = r.Annotations, r.Labels
		}
	}
	firing := func(alert string) []map[string]any {
		var out []map[string]any
		for _, inst := range []string{"gw1", "gw2"} {
			l := map[string]string{"instance": inst}
			for k, v := range labels[alert] {
				l[k] = v
			}
			a := map[string]string{}
			for k, v := range annotations[alert] {
				a[k] = strings.ReplaceAll(v, "{{ $labels.instance }}", inst)
			}
			out = append(out, map[string]any{"exp_labels": l, "exp_annotations": a})
		}
		return out
	}
	abs, err := filepath.Abs("../../deploy/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		pgDownAt int
		fire     []string
	}{
		{"PostgreSQL up, nobody using the service", 60, nil},
		{"PostgreSQL down from 5m, nobody using the service", 10, []string{"HanPostgresDown", "HanOutboxRelayFailing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]bool{}
			for _, n := range tc.fire {
				if labels[n] == nil {
					t.Errorf("deploy/prometheus-alerts.yml has no %s alert", n)
				}
				want[n] = true
			}
			var checks []map[string]any
			for _, n := range names {
				exp := []map[string]any{}
				if want[n] {
					exp = firing(n)
				}
				checks = append(checks, map[string]any{"eval_time": "25m", "alertname": n, "exp_alerts": exp})
			}
			b, err := yaml.Marshal(map[string]any{
				"rule_files":          []string{abs},
				"evaluation_interval": "30s",
				"tests": []map[string]any{{"name": tc.name, "interval": "30s",
					"input_series": quietHourSeries(tc.pgDownAt), "alert_rule_test": checks}},
			})
			if err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(t.TempDir(), "quiet-hour.test.yml")
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(pt, "test", "rules", f).CombinedOutput(); err != nil {
				t.Fatalf("%s: want exactly %v firing at 25m among the %d alerts: %v\n%s", tc.name, tc.fire, len(names), err, out)
			}
		})
	}
}
