package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/loadtest/scenarios"
)

var env *testenv.Env

// TestMain doubles as the baseline-server child that `-target baseline`
// starts from os.Executable() (this test binary, under go test).
func TestMain(m *testing.M) {
	// help_test.go runs the real main() with any arguments this way.
	if len(os.Args) > 1 && os.Args[1] == "baseline-server" || os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testenv.Main(m, testenv.Options{}, &env)
}

type result struct {
	code           int
	stdout, stderr string
}

func runMain(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	m := NewMain(strings.NewReader(""), &out, &errb, func(string) string { return "" })
	if err := m.ParseFlags(args); err != nil {
		return result{code: ExitUsage, stderr: err.Error()}
	}
	code := m.Run(context.Background())
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

type export struct {
	Passed  bool `json:"passed"`
	Metrics map[string]struct {
		Values map[string]float64 `json:"values"`
	} `json:"metrics"`
	Thresholds []struct {
		Expr string `json:"expr"`
		OK   bool   `json:"ok"`
	} `json:"thresholds"`
}

func readExport(t *testing.T, path string) export {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var e export
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return e
}

// The smoke shape of `make loadtest`, tiny.
func smoke(extra ...string) []string {
	return append([]string{"run", "broadcast", "-target", "baseline-inprocess", "-conns", "50", "-dialogs", "5",
		"-rate", "100", "-duration", "1s", "-drain", "20s", "-quiet",
		"-threshold", "delivery_lost==0", "-threshold", "delivery_p99<30s", "-threshold", "publish_failed<1%"}, extra...)
}

func TestBroadcastSmokePassesAndExports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.json")
	r := runMain(t, smoke("-summary-export", path)...)
	if r.code != ExitOK {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "✓ delivery_lost==0") || !strings.Contains(r.stdout, "result: passed") {
		t.Fatalf("summary:\n%s", r.stdout)
	}
	e := readExport(t, path)
	exp := e.Metrics["delivery_expected"].Values["count"]
	if !e.Passed || exp != 1000 || e.Metrics["delivery_received"].Values["count"] != exp || len(e.Thresholds) != 3 {
		t.Fatalf("export: %+v", e)
	}
}

func TestImpossibleThresholdExitsNonZero(t *testing.T) {
	r := runMain(t, smoke("-threshold", "delivery_p99<1ns")...)
	if r.code != ExitThresholds {
		t.Fatalf("exit %d, want %d\n%s", r.code, ExitThresholds, r.stdout)
	}
	if !strings.Contains(r.stdout, "✗ delivery_p99<1ns") || !strings.Contains(r.stdout, "result: FAILED") {
		t.Fatalf("summary:\n%s", r.stdout)
	}
}

// Breaking delivery (the baseline drops every 5th event) fails the smoke.
func TestBrokenDeliveryFailsTheSmoke(t *testing.T) {
	scenarios.BaselineConfig.DropEvery = 5
	defer func() { scenarios.BaselineConfig.DropEvery = 0 }()
	path := filepath.Join(t.TempDir(), "summary.json")
	// Loss never drains: wait 2s, not the smoke's 20s, for stragglers.
	r := runMain(t, smoke("-summary-export", path, "-drain", "2s")...)
	if r.code != ExitThresholds {
		t.Fatalf("exit %d, want %d\n%s", r.code, ExitThresholds, r.stdout)
	}
	if e := readExport(t, path); e.Passed || e.Metrics["delivery_lost"].Values["count"] != 200 {
		t.Fatalf("export: %+v", e)
	}
}

func TestUsageErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no command":           nil,
		"unknown command":      {"frobnicate"},
		"no scenario":          {"run"},
		"unknown scenario":     {"run", "nope"},
		"remote target":        {"run", "broadcast", "-target", "http://10.0.0.1:8080"},
		"remote baseline":      {"run", "broadcast", "-target", "baseline:http://8.8.8.8:80"},
		"remote centrifugo":    {"run", "broadcast", "-target", "centrifugo:http://8.8.8.8:8000"},
		"bad threshold":        {"run", "broadcast", "-threshold", "delivery_p99"},
		"unknown metric":       {"run", "broadcast", "-target", "baseline-inprocess", "-threshold", "nosuch_p99<1ms"},
		"stray argument":       {"run", "broadcast", "extra"},
		"remote baseline bind": {"baseline-server", "-addr", "0.0.0.0:9090"},
		"keyword in a list":    {"run", "broadcast", "-target", "http://127.0.0.1:8080,baseline-inprocess"},
		"remote in a list":     {"run", "chat-fanout", "-target", "http://127.0.0.1:8080", "-target", "http://10.0.0.1:8080"},
		"empty list entry":     {"run", "chat-fanout", "-target", "http://127.0.0.1:8080,,http://127.0.0.1:8081"},
	} {
		if r := runMain(t, args...); r.code != ExitUsage {
			t.Errorf("%s: exit %d, want %d (%s)", name, r.code, ExitUsage, r.stderr)
		}
	}
	// A scenario refusing its flags or plan is a usage error too, found
	// before any connection.
	for name, args := range map[string][]string{
		"zero rate":                   {"-rate", "0"},
		"negative drain":              {"-drain", "-1s"},
		"payload too large":           {"-payload", "100000"},
		"bad step rate":               {"-step-rates", "10,-1"},
		"dialogs without subscriber":  {"-conns", "2", "-dialogs", "3"},
		"huge shape":                  {"-conns", "2000000", "-dialogs", "3"},
		"zero max-duration":           {"-max-duration", "0"},
		"negative max-duration":       {"-max-duration", "-5s"},
		"unbounded max-duration":      {"-max-duration", "1000h"},
		"max-duration over the cap":   {"-max-duration", "3h0m1s"},
		"max-duration below duration": {"-max-duration", "500ms"},
	} {
		args = append([]string{"run", "broadcast", "-target", "baseline-inprocess", "-duration", "1s", "-quiet"}, args...)
		if r := runMain(t, args...); r.code != ExitUsage {
			t.Errorf("%s: exit %d, want %d (%s%s)", name, r.code, ExitUsage, r.stderr, r.stdout)
		}
	}
	if r := runMain(t, "scenarios"); r.code != ExitOK || !strings.Contains(r.stdout, "connect-storm") {
		t.Fatalf("scenarios: %d %s", r.code, r.stdout)
	}
}

// The bound of a run is not negotiable: a scenario file cannot lift it
// either.
func TestMaxDurationFromAScenarioFileIsBounded(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte(`{"options":{"target":"baseline-inprocess","max-duration":"100000h"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runMain(t, "run", "broadcast", "-config", cfg, "-quiet"); r.code != ExitUsage {
		t.Fatalf("exit %d, want %d (%s%s)", r.code, ExitUsage, r.stderr, r.stdout)
	}
}

// A target that accepts connections and then never answers cannot hold a
// run: it ends at -max-duration, exit 1, the summary naming the bound.
func TestRunStopsAtMaxDurationAgainstAStalledTarget(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stalled := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(stalled)
				return
			}
			stalled <- c // held open, never read nor written
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range stalled {
			c.Close()
		}
	})
	t0 := time.Now()
	r := runMain(t, "run", "broadcast", "-target", "baseline:http://"+l.Addr().String(), "-conns", "4", "-dialogs", "2",
		"-rate", "20", "-duration", "1s", "-max-duration", "2s", "-source-range", "none", "-quiet")
	took := time.Since(t0)
	if r.code != ExitError || !strings.Contains(r.stdout, "hit its 2s bound") {
		t.Fatalf("exit %d, want %d with the bound named\n%s%s", r.code, ExitError, r.stdout, r.stderr)
	}
	if took > 5*time.Second {
		t.Errorf("the run took %s with -max-duration 2s", took.Round(100*time.Millisecond))
	}
}

// -target repeated adds a gateway to the list; a comma-separated list is
// the same; the first -target on the command line replaces the default
// and a scenario file's target.
func TestTargetListFlag(t *testing.T) {
	parse := func(args ...string) string {
		t.Helper()
		m := NewMain(strings.NewReader(""), io.Discard, io.Discard, func(string) string { return "" })
		if err := m.ParseFlags(append([]string{"run", "chat-fanout"}, args...)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return m.opts.Target
	}
	const a, b = "http://127.0.0.1:8080", "http://127.0.0.1:8081"
	if got := parse(); got != "http://127.0.0.1:8080" {
		t.Errorf("default target %q", got)
	}
	if got := parse("-target", a, "-target", b); got != a+","+b {
		t.Errorf("repeated -target: %q", got)
	}
	if got := parse("-target", a+","+b); got != a+","+b {
		t.Errorf("comma-separated -target: %q", got)
	}
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte(`{"options":{"target":"http://127.0.0.1:9999"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := parse("-config", cfg); got != "http://127.0.0.1:9999" {
		t.Errorf("the file's target: %q", got)
	}
	if got := parse("-config", cfg, "-target", b); got != b {
		t.Errorf("-target over the file's: %q, want %q", got, b)
	}
}

func TestScenarioFileWithFlagOverrides(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "broadcast.json")
	doc := `{"scenario":"broadcast","options":{"target":"baseline-inprocess","conns":20,"dialogs":2,"rate":40,
	  "duration":"5m","quiet":true},"thresholds":["delivery_lost==0"]}`
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "out.json")
	// The file asks for 5 minutes; the flag overrides it.
	r := runMain(t, "run", "broadcast", "-config", cfg, "-duration", "500ms", "-summary-export", path)
	if r.code != ExitOK {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	e := readExport(t, path)
	// 40/s for 0.5s = 20 events × 10 subscribers.
	if e.Metrics["delivery_expected"].Values["count"] != 200 || len(e.Thresholds) != 1 {
		t.Fatalf("export: %+v", e)
	}
	if err := os.WriteFile(cfg, []byte(`{"scenario":"idle-connections"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runMain(t, "run", "broadcast", "-config", cfg); r.code != ExitUsage {
		t.Fatalf("a file for another scenario: exit %d", r.code)
	}
	if err := os.WriteFile(cfg, []byte(`{"options":{"nosuchflag":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runMain(t, "run", "broadcast", "-config", cfg); r.code != ExitUsage {
		t.Fatalf("an unknown option: exit %d", r.code)
	}
}

// -target baseline starts `han-loadtest baseline-server` as a child
// process, so the server's memory is measured apart from the generator's.
func TestIdleAgainstBaselineChildProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.json")
	r := runMain(t, "run", "idle-connections", "-target", "baseline", "-conns", "40", "-duration", "100ms",
		"-settle", "10ms", "-quiet", "-summary-export", path, "-threshold", "server_mem_per_conn<1MiB")
	if r.code != ExitOK {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	e := readExport(t, path)
	// The baseline runs a reader and a writer per connection; nothing of
	// the load generator is counted in a child process.
	if g := e.Metrics["server_goroutines_per_conn"].Values["value"]; g != 2 {
		t.Fatalf("goroutines per connection = %v, want 2", g)
	}
	if m := e.Metrics["server_mem_per_conn"].Values["value"]; m <= 1024 {
		t.Fatalf("memory per connection = %v bytes", m)
	}
}

func TestBaselineServerCommand(t *testing.T) {
	stdinR, stdinW := io.Pipe()
	outR, outW := io.Pipe()
	m := NewMain(stdinR, outW, io.Discard, func(string) string { return "" })
	if err := m.ParseFlags([]string{"baseline-server", "-addr", "127.0.0.1:0", "-exit-on-stdin-eof"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { done <- m.Run(context.Background()) }()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSpace(strings.TrimPrefix(line, scenarios.BaselineListenLine))
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	stdinW.Close() // the parent went away
	select {
	case code := <-done:
		if code != ExitOK {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("baseline-server did not exit on stdin EOF")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	outW.Close()
}

// Secrets taken from the environment are never shown as flag defaults.
func TestHelpDoesNotPrintSecrets(t *testing.T) {
	const secret = "dev-secret-from-the-environment-0123456789"
	var out, errb bytes.Buffer
	m := NewMain(strings.NewReader(""), &out, &errb, func(k string) string {
		switch k {
		case "HAN_JWT_DEV_HS256_SECRET":
			return secret
		case "REDIS_REALTIME_URL":
			return "redis://api_backend:" + secret + "@127.0.0.1:6379/1"
		}
		return ""
	})
	if err := m.ParseFlags([]string{"run", "broadcast", "-h"}); err != errHelp {
		t.Fatalf("ParseFlags(-h) = %v", err)
	}
	if !strings.Contains(out.String(), "-dev-secret") || strings.Contains(out.String()+errb.String(), secret) {
		t.Fatalf("help output leaks the secret or lacks the flag:\n%s", out.String())
	}
}
