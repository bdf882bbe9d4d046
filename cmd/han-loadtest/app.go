package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/loadtest/baseline"
	"github.com/han-app/gateway/loadtest/scenarios"
)

// Exit codes.
const (
	ExitOK         = 0
	ExitError      = 1  // the run failed (target unreachable, scenario error)
	ExitUsage      = 2  // bad command line or scenario file
	ExitThresholds = 99 // a threshold failed (k6's code)
)

// errHelp is returned by ParseFlags after printing requested help (exit 0).
var errHelp = errors.New("help requested")

const usage = `usage:
  han-loadtest run SCENARIO [flags]     run a scenario (han-loadtest run SCENARIO -h lists its flags)
  han-loadtest scenarios                list the scenarios
  han-loadtest baseline-server [flags]  serve the minimal broadcast server (the baseline target)

han-loadtest COMMAND -h shows a command's flags and the environment variables it reads.
Exit status: 0 passed, 99 a threshold failed, 1 the run failed, 2 usage.
Targets are loopback only. See docs/loadtest.md.
`

// Main is the program: ParseFlags, Run (returns the exit code), Close.
// Tests drive it with their own streams and environment.
type Main struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	cmd string

	// run
	scenario      scenarios.Scenario
	opts          loadtest.Options
	summaryExport string
	cpuProfile    string

	// baseline-server
	addr      string
	bcfg      baseline.Config
	exitOnEOF bool
	server    *baseline.Server
}

// NewMain returns a Main reading and writing the given streams.
func NewMain(stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *Main {
	return &Main{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
}

// thresholdList is a repeatable -threshold flag.
type thresholdList []string

func (l *thresholdList) String() string     { return strings.Join(*l, ",") }
func (l *thresholdList) Set(v string) error { *l = append(*l, v); return nil }

// targetFlag is -target: one target, or several gateways given as a
// comma-separated list or by repeating the flag. The first value set on
// the command line replaces the default and the scenario file's value;
// later ones add to it.
type targetFlag struct {
	v     *string
	added bool // a value came from the command line
}

func (f *targetFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f *targetFlag) Set(v string) error {
	if f.added {
		*f.v += "," + v
		return nil
	}
	*f.v, f.added = v, true
	return nil
}

// scenarioFile is the -config document: flag values by name and thresholds.
type scenarioFile struct {
	Scenario   string         `json:"scenario"`
	Options    map[string]any `json:"options"`
	Thresholds []string       `json:"thresholds"`
}

// ParseFlags reads the command line.
func (m *Main) ParseFlags(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(m.stderr, usage)
		return errors.New("no command")
	}
	m.cmd = args[0]
	switch m.cmd {
	case "run":
		return m.parseRun(args[1:])
	case "baseline-server":
		return m.parseBaseline(args[1:])
	case "scenarios":
		if len(args) > 1 && isHelp(args[1]) {
			fmt.Fprint(m.stdout, "usage: han-loadtest scenarios\n\nLists the scenarios; it reads no environment variables.\n")
			return errHelp
		}
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(m.stdout, usage)
		return errHelp
	}
	fmt.Fprint(m.stderr, usage)
	return fmt.Errorf("unknown command %q", m.cmd)
}

// runEnv is the environment `run` reads against a gateway target.
const runEnv = `Environment (gateway targets; flags override):
  HAN_JWT_DEV_HS256_SECRET  the gateway's dev secret, to mint user tokens (-dev-secret)
  HAN_ALLOWED_ORIGINS       its first origin is the WebSocket Origin header (-origin)
  REDIS_REALTIME_URL        Redis DB1, where the broadcast scenario publishes (-redis-url)
  HAN_PUBSUB_MODE           auto, sharded or classic: how it publishes there, as the gateways (-pubsub-mode)
send-sql (the send path's SQL alone) reads the gateway's own variables:
  DATABASE_URL (-database-url), HAN_DB_EXEC_MODE (-exec-mode),
  HAN_DB_REQUEST_TIMEOUT, HAN_IDEMPOTENCY_TTL, HAN_LEGACY_STUB_ENABLED
`

func (m *Main) parseRun(args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(m.stdout, "usage: han-loadtest run SCENARIO [flags]\n\nScenarios: han-loadtest scenarios; "+
			"a scenario's flags: han-loadtest run SCENARIO -h\n\n"+runEnv)
		return errHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("run: name a scenario (han-loadtest scenarios lists them)")
	}
	sc, err := scenarios.New(args[0])
	if err != nil {
		return err
	}
	m.scenario = sc
	fs := flag.NewFlagSet("han-loadtest run "+args[0], flag.ContinueOnError)
	var ths thresholdList
	var config string
	var quiet bool
	m.opts.Target = scenarios.DefaultTarget
	target := &targetFlag{v: &m.opts.Target}
	fs.Var(target, "target",
		"loopback gateway URL, or baseline (child process), baseline-inprocess, baseline:<url>, centrifugo:<url> (a running Centrifugo v6); "+
			"several gateway URLs, comma-separated or with the flag repeated, spread the connections and REST calls over them (chat-fanout, broadcast, idle-connections)")
	fs.DurationVar(&m.opts.Duration, "duration", 10*time.Second, "length of the measured phase")
	fs.DurationVar(&m.opts.MaxDuration, "max-duration", 0,
		fmt.Sprintf("hard bound on the whole run, setup and teardown included: at most %s (default duration + %s)", loadtest.MaxRunDuration, loadtest.DefaultRunOverhead))
	fs.Var(&ths, "threshold", "pass/fail criterion, repeatable: delivery_p99<150ms, http_req_failed<0.1%, ws_connect_p95<500ms")
	fs.StringVar(&m.summaryExport, "summary-export", "", "write the summary as JSON to this file")
	fs.StringVar(&m.cpuProfile, "cpuprofile", "", "write the generator's own CPU profile (go tool pprof) of the whole run to this file")
	fs.StringVar(&config, "config", "", "scenario file (JSON: {\"options\":{flag:value…},\"thresholds\":[…]}); flags override it")
	fs.BoolVar(&quiet, "quiet", false, "no live progress line")
	fs.DurationVar(&m.opts.ProgressInterval, "progress-interval", 0, "progress line period (default 1s on a terminal, 5s otherwise)")
	fs.StringVar(&m.opts.SourceRange, "source-range", loadtest.DefaultSourceRange, "loopback source addresses clients bind to (A-B, or none)")
	sc.Flags(fs, m.getenv)

	var fileThresholds []string
	if config = flagValue(args[1:], "config"); config != "" {
		f, err := readScenarioFile(config)
		if err != nil {
			return err
		}
		if f.Scenario != "" && f.Scenario != sc.Name() {
			return fmt.Errorf("%s is for scenario %q, not %q", config, f.Scenario, sc.Name())
		}
		for k, v := range f.Options {
			if fs.Lookup(k) == nil || k == "config" {
				return fmt.Errorf("%s: unknown option %q", config, k)
			}
			if err := fs.Set(k, fmt.Sprint(v)); err != nil {
				return fmt.Errorf("%s: option %q: %w", config, k, err)
			}
		}
		fileThresholds = f.Thresholds
		target.added = false // a -target on the command line replaces the file's
	}
	if err := m.parse(fs, args[1:], "usage: han-loadtest run "+sc.Name()+" [flags]\n\n"+runEnv+"\nFlags:\n"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := checkMaxDuration(fs, m.opts.MaxDuration); err != nil {
		return err
	}
	m.opts.Thresholds = append(fileThresholds, ths...)
	if _, err := loadtest.ParseThresholds(m.opts.Thresholds); err != nil {
		return err
	}
	if err := checkTarget(m.opts.Target); err != nil {
		return err
	}
	if !quiet {
		m.opts.Progress = m.stderr
	}
	return nil
}

// checkMaxDuration refuses a -max-duration given (on the command line or
// in the scenario file) as zero, negative or above loadtest.MaxRunDuration:
// left out, the bound is the duration plus loadtest.DefaultRunOverhead, and
// a run is never unbounded.
func checkMaxDuration(fs *flag.FlagSet, d time.Duration) error {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "max-duration" })
	if !given {
		return nil
	}
	if loadtest.CheckMaxDuration(d) != nil {
		return fmt.Errorf("-max-duration %s: a run's bound must be in (0, %s]", d, loadtest.MaxRunDuration)
	}
	return nil
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// parse parses a command's flags. On -h it prints about and the flags to
// stdout and returns errHelp; a bad flag's message is only returned, so
// main prints it once.
func (m *Main) parse(fs *flag.FlagSet, args []string, about string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(m.stdout, about)
		fs.SetOutput(m.stdout)
		fs.PrintDefaults()
		return errHelp
	}
	return err
}

// flagValue finds -name value / -name=value in args before flag parsing
// (the scenario file is applied first so that flags override it).
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func readScenarioFile(path string) (*scenarioFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f scenarioFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// checkTarget refuses a non-loopback target before anything starts; in a
// list of several, each must be a loopback gateway URL.
func checkTarget(t string) error {
	list, err := loadtest.SplitTargets(t)
	if err != nil {
		return err
	}
	if len(list) > 1 {
		for _, one := range list {
			u, err := loadtest.CheckLoopbackURL(one)
			if err != nil {
				return err
			}
			if u.Scheme != "http" {
				return fmt.Errorf("target %q: a list names gateways only (http://<loopback>:<port>)", one)
			}
		}
		return nil
	}
	switch {
	case t == scenarios.TargetBaseline, t == scenarios.TargetBaselineInProcess:
		return nil
	case strings.HasPrefix(t, "baseline:"):
		_, err := loadtest.CheckLoopbackURL(strings.TrimPrefix(t, "baseline:"))
		return err
	case strings.HasPrefix(t, scenarios.CentrifugoURLPrefix):
		_, err := loadtest.CheckLoopbackURL(strings.TrimPrefix(t, scenarios.CentrifugoURLPrefix))
		return err
	}
	_, err = loadtest.CheckLoopbackURL(t)
	return err
}

func (m *Main) parseBaseline(args []string) error {
	fs := flag.NewFlagSet("han-loadtest baseline-server", flag.ContinueOnError)
	fs.StringVar(&m.addr, "addr", "127.0.0.1:9090", "listen address (loopback)")
	fs.IntVar(&m.bcfg.QueueSize, "queue", 0, "outbound queue per connection (default 128)")
	fs.Int64Var(&m.bcfg.DropEvery, "drop-every", 0, "drop every n-th delivery (fault injection: proves a load test sees loss)")
	fs.BoolVar(&m.exitOnEOF, "exit-on-stdin-eof", false, "exit when stdin closes (used when han-loadtest starts it as a child)")
	if err := m.parse(fs, args, "usage: han-loadtest baseline-server [flags]\n\nServes the minimal broadcast server; "+
		"it reads no environment variables.\n\nFlags:\n"); err != nil {
		return err
	}
	host := m.addr
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	return loadtest.CheckLoopbackHost(host)
}

// Run executes the command and returns the exit code.
func (m *Main) Run(ctx context.Context) int {
	switch m.cmd {
	case "scenarios":
		for _, n := range scenarios.Names() {
			sc, _ := scenarios.New(n)
			fmt.Fprintf(m.stdout, "  %-18s %s\n", n, sc.Describe())
		}
		return ExitOK
	case "baseline-server":
		return m.runBaseline(ctx)
	}
	return m.runScenario(ctx)
}

func (m *Main) runScenario(ctx context.Context) int {
	if m.cpuProfile != "" {
		f, err := os.Create(m.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(m.stderr, "han-loadtest: cpu profile:", err)
			return ExitUsage
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				fmt.Fprintln(m.stderr, "han-loadtest: cpu profile:", err)
			}
		}()
	}
	sum, err := loadtest.Run(ctx, m.scenario, m.opts)
	if err != nil {
		fmt.Fprintln(m.stderr, "han-loadtest:", err)
		return ExitUsage
	}
	sum.WriteText(m.stdout)
	if m.summaryExport != "" {
		f, err := os.Create(m.summaryExport)
		if err == nil {
			err = sum.WriteJSON(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(m.stderr, "han-loadtest: summary export:", err)
			return ExitError
		}
	}
	var usage *loadtest.UsageError
	switch {
	case errors.As(sum.Err, &usage):
		return ExitUsage
	case sum.Err != nil:
		return ExitError
	case !sum.ThresholdsPassed():
		return ExitThresholds
	}
	return ExitOK
}

func (m *Main) runBaseline(ctx context.Context) int {
	m.server = baseline.New(m.bcfg, nil)
	if err := m.server.Start(m.addr); err != nil {
		fmt.Fprintln(m.stderr, "han-loadtest: baseline-server:", err)
		return ExitError
	}
	if _, err := loadtest.RaiseFileLimit(); err != nil {
		fmt.Fprintln(m.stderr, "han-loadtest: baseline-server: raise RLIMIT_NOFILE:", err)
	}
	fmt.Fprintln(m.stdout, scenarios.BaselineListenLine+m.server.URL())
	eof := make(chan struct{})
	if m.exitOnEOF {
		go func() {
			_, _ = io.Copy(io.Discard, m.stdin)
			close(eof)
		}()
	}
	select {
	case <-ctx.Done():
	case <-eof:
	}
	return ExitOK
}

// Close stops what Run started. Idempotent.
func (m *Main) Close() error {
	if m.server != nil {
		err := m.server.Close()
		m.server = nil
		return err
	}
	return nil
}
