package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/common/model"
	"github.com/segmentio/encoding/json"
	"go.yaml.in/yaml/v3"
)

type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
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

// clusterOnlyFamilies are exported only by a subscriber on a Redis Cluster
// (pubsub/shard_metrics.go).
var clusterOnlyFamilies = []string{"han_pubsub_shard_link_up", "han_pubsub_shard_channels",
	"han_pubsub_shard_reconnects_total", "han_pubsub_shard_ping_seconds"}

var metricName = regexp.MustCompile(`\b(?:han|go|process)_[a-zA-Z0-9_]+`)

// recordedName matches a recording rule's level:metric:operation name.
var recordedName = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]`)

// checkExpr reports what is wrong with a PromQL expression: unbalanced
// brackets or quotes, or a metric the live /metrics does not expose and no
// recording rule of recorded defines.
func checkExpr(expr string, live, recorded map[string]bool) []string {
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
	// Label matchers, strings and grouping label lists are not metric names.
	stripped := regexp.MustCompile(`\{[^}]*\}|"[^"]*"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(expr, "")
	rec := recordedName.FindAllString(stripped, -1)
	for _, n := range rec {
		if !recorded[n] {
			errs = append(errs, "unknown recorded series "+n)
		}
	}
	stripped = recordedName.ReplaceAllString(stripped, "")
	names := metricName.FindAllString(stripped, -1)
	if len(names)+len(rec) == 0 {
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
	recorded := map[string]bool{"le:han_h_bucket:rate5m": true}
	for expr, bad := range map[string]bool{
		`histogram_quantile(0.9, le:han_h_bucket:rate5m)`: false,
		`count by (go_version) (han_a)`:                   false,
		`code:han_a:rate5m`:                               true,
		`sum(rate(han_a[5m])) > 1`:                        false,
		`histogram_quantile(0.9, rate(han_h_bucket[5m]))`: false,
		`sum(rate(han_a{code=~"5.."}[5m]))`:               false,
		`sum(rate(han_b[5m]))`:                            true,
		`sum(rate(han_a[5m])`:                             true,
		`han_a{code="5`:                                   true,
		`vector(1)`:                                       true,
	} {
		if got := len(checkExpr(expr, live, recorded)) > 0; got != bad {
			t.Errorf("checkExpr(%s): bad=%v, want %v (%v)", expr, got, bad, checkExpr(expr, live, recorded))
		}
	}
}

// readRules parses a rules file of deploy/, refusing unknown fields.
func readRules(t *testing.T, name string) ruleFile {
	t.Helper()
	b, err := os.ReadFile("../../deploy/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rules
}

// headingAnchors returns the anchors a Markdown renderer gives the
// headings of a document: lower case, spaces to dashes, punctuation other
// than - and _ dropped.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var a strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		out[a.String()] = true
	}
	return out
}

// The shipped alert and recording rules and dashboard:
// deploy/prometheus-alerts.yml, deploy/prometheus-recording-rules.yml and
// deploy/grafana-dashboard.json parse, are complete, every metric they
// query exists in a live scrape of the service (or is recorded by a rule
// whose own metrics do), and every alert links a runbook section that
// exists.
func TestDeployAlertsAndDashboardValidate(t *testing.T) {
	m, _ := metricsScenario(t)
	live := map[string]bool{}
	for name := range scrape(t, m) {
		live[name] = true
	}
	// The per-shard Pub/Sub families exist only on a Redis Cluster, which
	// this scrape is not; internal/clustertest checks that a subscriber on
	// a cluster exports every han_pubsub_shard_* name the alerts and the
	// dashboard use.
	for _, name := range clusterOnlyFamilies {
		live[name] = true
	}

	recording := readRules(t, "prometheus-recording-rules.yml")
	recorded := map[string]bool{}
	recordedExpr := map[string]string{}
	for _, g := range recording.Groups {
		for _, r := range g.Rules {
			if r.Record == "" || r.Alert != "" || recorded[r.Record] || !recordedName.MatchString(r.Record) {
				t.Errorf("recording rule %q: a unique level:metric:operation name and no alert", r.Record)
			}
			for _, e := range checkExpr(r.Expr, live, nil) {
				t.Errorf("%s: %s in %s", r.Record, e, r.Expr)
			}
			recorded[r.Record] = true
			recordedExpr[r.Record] = r.Expr
		}
	}

	rules := readRules(t, "prometheus-alerts.yml")
	anchors := map[string]map[string]bool{}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: a name and rules are required", g.Name)
		}
		for _, r := range g.Rules {
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
			file, anchor, ok := strings.Cut(r.Annotations["runbook_url"], "#")
			if !ok || !strings.HasPrefix(file, "docs/") || anchor == "" {
				t.Errorf("%s: runbook_url %q: want docs/FILE.md#section", r.Alert, r.Annotations["runbook_url"])
			} else {
				if anchors[file] == nil {
					anchors[file] = headingAnchors(t, "../../"+file)
				}
				if !anchors[file][anchor] {
					t.Errorf("%s: runbook_url %s: %s has no such heading", r.Alert, r.Annotations["runbook_url"], file)
				}
			}
			for _, e := range checkExpr(r.Expr, live, recorded) {
				t.Errorf("%s: %s in %s", r.Alert, e, r.Expr)
			}
		}
	}
	for _, must := range []string{"HanRedisDown", "HanRedisEvictions", "HanPubSubLinkDown", "HanOutboxBacklog", "HanProjectWritesRefused"} {
		if !seen[must] {
			t.Errorf("no %s alert", must)
		}
	}

	b, err := os.ReadFile("../../deploy/grafana-dashboard.json")
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
			for _, e := range checkExpr(tg.Expr, live, recorded) {
				t.Errorf("panel %q: %s in %s", p.Title, e, tg.Expr)
			}
			expr := tg.Expr
			for _, r := range recordedName.FindAllString(expr, -1) {
				expr += " " + recordedExpr[r]
			}
			for _, name := range metricName.FindAllString(recordedName.ReplaceAllString(expr, ""), -1) {
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

// promtool returns the promtool binary (Debian package prometheus). It is
// optional on a workstation; under CI=true its absence fails, because
// .ci/run installs it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found: .ci/run installs it (Debian package prometheus)")
		}
		t.Skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
	}
	return p
}

// The alert and recording rules pass promtool's checks and their unit
// tests (deploy/prometheus-rules.test.yml).
func TestPromtoolRules(t *testing.T) {
	pt := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "prometheus-alerts.yml", "prometheus-recording-rules.yml"},
		{"test", "rules", "prometheus-rules.test.yml"},
	} {
		cmd := exec.Command(pt, args...)
		cmd.Dir = "../../deploy"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// A live scrape, after traffic has filled every family, passes promtool
// check metrics (names, units, help texts, counter suffixes).
func TestPromtoolCheckMetricsOnLiveScrape(t *testing.T) {
	pt := promtool(t)
	m, _ := metricsScenario(t)
	resp, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	cmd := exec.Command(pt, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// han_build_info names the running build: one series, value 1, the Go
// version of the binary and non-empty version and commit labels.
func TestBuildInfoIsScraped(t *testing.T) {
	m := start(t, baseEnv())
	f := scrape(t, m)["han_build_info"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("han_build_info: %v", f)
	}
	got := map[string]string{}
	for _, l := range f.GetMetric()[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if f.GetMetric()[0].GetGauge().GetValue() != 1 || got["go_version"] != runtime.Version() || got["version"] == "" || got["commit"] == "" {
		t.Fatalf("han_build_info: %v = %v", got, f.GetMetric()[0].GetGauge().GetValue())
	}
}

// The systemd unit keeps attachments across restarts (HAN_BLOB_DIR in its
// state directory, not under the private temporary directory) and, where
// systemd-analyze can score a unit file offline, its sandbox scores at
// most 3.0 ("OK").
func TestSystemdUnitKeepsBlobsAndIsHardened(t *testing.T) {
	const unit = "../../deploy/systemd/han-gateway.service"
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string][]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(k, "#") {
			settings[k] = append(settings[k], v)
		}
	}
	var blobDir string
	for _, e := range settings["Environment"] {
		if v, ok := strings.CutPrefix(e, "HAN_BLOB_DIR="); ok {
			blobDir = v
		}
	}
	if len(settings["StateDirectory"]) != 1 || !strings.HasPrefix(blobDir, "/var/lib/"+settings["StateDirectory"][0]+"/") {
		t.Fatalf("HAN_BLOB_DIR=%q must lie in the unit's StateDirectory %v", blobDir, settings["StateDirectory"])
	}
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not found: .ci/run installs it (Debian package systemd)")
		}
		t.Skip("systemd-analyze not installed")
	}
	out, err := exec.Command(sa, "security", "--offline=true", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for han-gateway\.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze cannot score the unit file offline: %v %s", err, out)
		}
		t.Skipf("systemd-analyze cannot score a unit file offline here: %v %s", err, out)
	}
	if score, perr := strconv.ParseFloat(string(m[1]), 64); perr != nil || score > 3 {
		t.Fatalf("systemd-analyze security: exposure %s, want at most 3.0\n%s", m[1], out)
	}
}
