package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/segmentio/encoding/json"
	"go.yaml.in/yaml/v3"
)

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var metricName = regexp.MustCompile(`\b(?:han|go|process)_[a-zA-Z0-9_]+`)

// checkExpr reports what is wrong with a PromQL expression: unbalanced
// brackets or quotes, or a metric the live /metrics does not expose.
func checkExpr(expr string, live map[string]bool) []string {
	var errs []string
	depth := map[rune]int{}
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inQuote := false
	for _, r := range expr {
		switch {
		case r == '"':
			inQuote = !inQuote
		case inQuote:
		case r == '(' || r == '[' || r == '{':
			depth[r]++
		case pairs[r] != 0:
			depth[pairs[r]]--
			if depth[pairs[r]] < 0 {
				errs = append(errs, "unbalanced "+string(r))
			}
		}
	}
	if inQuote {
		errs = append(errs, "unterminated string")
	}
	for r, d := range depth {
		if d != 0 {
			errs = append(errs, "unbalanced "+string(r))
		}
	}
	// Label matchers and strings are not metric names.
	stripped := regexp.MustCompile(`\{[^}]*\}|"[^"]*"`).ReplaceAllString(expr, "")
	names := metricName.FindAllString(stripped, -1)
	if len(names) == 0 {
		errs = append(errs, "no metric")
	}
	for _, n := range names {
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok && live[b] {
				base = b
			}
		}
		if !live[base] {
			errs = append(errs, "unknown metric "+n)
		}
	}
	return errs
}

func TestCheckExprCatchesMistakes(t *testing.T) {
	live := map[string]bool{"han_a": true, "han_h": true}
	for expr, bad := range map[string]bool{
		`sum(rate(han_a[5m])) > 1`:                        false,
		`histogram_quantile(0.9, rate(han_h_bucket[5m]))`: false,
		`sum(rate(han_a{code=~"5.."}[5m]))`:               false,
		`sum(rate(han_b[5m]))`:                            true,
		`sum(rate(han_a[5m])`:                             true,
		`han_a{code="5`:                                   true,
		`vector(1)`:                                       true,
	} {
		if got := len(checkExpr(expr, live)) > 0; got != bad {
			t.Errorf("checkExpr(%s): bad=%v, want %v (%v)", expr, got, bad, checkExpr(expr, live))
		}
	}
}

// The shipped alert rules and dashboard: deploy/prometheus-alerts.yml and
// deploy/grafana-dashboard.json parse, are complete, and every metric they
// query exists in a live scrape of the service.
func TestDeployAlertsAndDashboardValidate(t *testing.T) {
	m, _ := metricsScenario(t)
	live := map[string]bool{}
	for name := range scrape(t, m) {
		live[name] = true
	}

	b, err := os.ReadFile("../../deploy/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("prometheus-alerts.yml: %v", err)
	}
	seen := map[string]bool{}
	var n int
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: a name and rules are required", g.Name)
		}
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("rule %q: missing or duplicate alert name", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			for _, e := range checkExpr(r.Expr, live) {
				t.Errorf("%s: %s in %s", r.Alert, e, r.Expr)
			}
		}
	}
	for _, must := range []string{"HanRedisDown", "HanRedisEvictions", "HanPubSubLinkDown", "HanOutboxBacklog", "HanProjectWritesRefused"} {
		if !seen[must] {
			t.Errorf("no %s alert", must)
		}
	}

	b, err = os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks uid/title/schemaVersion/panels: %+v", d)
	}
	ids := map[int]bool{}
	covered := map[string]bool{}
	for _, p := range d.Panels {
		if p.Title == "" || p.Type == "" || ids[p.ID] || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: title, type, unique id and targets are required", p.ID, p.Title)
		}
		ids[p.ID] = true
		for _, tg := range p.Targets {
			for _, e := range checkExpr(tg.Expr, live) {
				t.Errorf("panel %q: %s in %s", p.Title, e, tg.Expr)
			}
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				covered[strings.TrimSuffix(name, "_bucket")] = true
			}
		}
	}
	// The dashboard shows every required metric family.
	for _, f := range requiredFamilies {
		if !covered[f] && f != "han_project_data_state_invalid_total" && f != "han_redis_memory_max_bytes" {
			t.Errorf("the dashboard does not show %s", f)
		}
	}
}
