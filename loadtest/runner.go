package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Scenario is one kind of load test. Run sets up its clients, drives its
// executors, waits for in-flight deliveries, tears down and returns; it
// must honour ctx, which ends at the run's hard time bound.
type Scenario interface {
	Name() string
	Run(ctx context.Context, t *T) error
}

// MetricDeclarer is implemented by scenarios with metrics of their own, so
// thresholds may name them before the run starts.
type MetricDeclarer interface {
	DeclareMetrics(reg *Registry)
}

// Options are the settings every scenario shares.
type Options struct {
	// Target names what is loaded: a loopback http:// base URL of the
	// gateway, or a scenario-specific keyword (e.g. "baseline").
	Target string
	// Duration of the measured phase. Zero value means 10s; at most
	// MaxExecutorDuration.
	Duration time.Duration
	// MaxDuration bounds the whole run, setup and teardown included: the
	// scenario's context ends then. Zero value means Duration +
	// DefaultRunOverhead; otherwise 1ns..MaxRunDuration and at least
	// Duration.
	MaxDuration time.Duration
	// Thresholds are expressions like delivery_p99<150ms.
	Thresholds []string
	// Progress receives the live progress line; nil means none.
	Progress io.Writer
	// ProgressInterval is how often the line refreshes. Zero value means
	// 1s on a terminal, 5s otherwise.
	ProgressInterval time.Duration
	// SourceRange is the loopback source address pool ("A-B", "none").
	// Zero value means DefaultSourceRange.
	SourceRange string
}

// Bounds on a whole run. A load run must stop by itself: the hard bound
// on setup, measurement and teardown together is never unbounded, and a
// typo such as -max-duration 100h is refused rather than leaving a
// runaway generator on a shared machine.
const (
	// DefaultRunOverhead is what a run gets for setup and teardown beyond
	// its measured phase when no MaxDuration is given.
	DefaultRunOverhead = 5 * time.Minute
	// MaxRunDuration is the largest MaxDuration: the longest measured
	// phase (MaxExecutorDuration) plus an hour of setup, steps and
	// teardown.
	MaxRunDuration = MaxExecutorDuration + time.Hour
)

// CheckMaxDuration refuses a bound on a whole run that is not positive or
// exceeds MaxRunDuration.
func CheckMaxDuration(d time.Duration) error {
	if d <= 0 || d > MaxRunDuration {
		return fmt.Errorf("loadtest: max duration must be in (0, %s], got %s", MaxRunDuration, d)
	}
	return nil
}

// UsageError is a scenario refusing its settings before it loads
// anything: a flag out of range, a shape or plan it cannot run, a target
// it does not drive. han-loadtest exits 2 for it, as for a bad command
// line, and 1 only for a run that failed.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

func (e *UsageError) Unwrap() error { return e.Err }

// Usage wraps err as a UsageError; nil stays nil.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return &UsageError{Err: err}
}

// FileReserve is the number of descriptors kept free for everything that is
// not a load connection (REST pools, publishers, Redis, the runtime).
const FileReserve = 1000

// T is what a running scenario gets: metrics, the source address pool and
// ways to report.
type T struct {
	Opts Options
	Reg  *Registry
	Src  *SourceAddrs
	// FileLimit is RLIMIT_NOFILE after raising it (0: unknown).
	FileLimit uint64

	mu    sync.Mutex // guards info, phase
	info  []Info
	phase string
	logw  io.Writer
}

// Info records a named result for the summary and the export.
func (t *T) Info(key string, v any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.info {
		if t.info[i].Key == key {
			t.info[i].Value = v
			return
		}
	}
	t.info = append(t.info, Info{key, v})
}

// SetPhase names what the scenario is doing, for the progress line.
func (t *T) SetPhase(p string) {
	t.mu.Lock()
	t.phase = p
	t.mu.Unlock()
}

func (t *T) currentPhase() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.phase
}

// Logf prints a line to the progress output.
func (t *T) Logf(format string, args ...any) {
	if t.logw != nil {
		fmt.Fprintf(t.logw, format+"\n", args...)
	}
}

// NeedFiles checks that conns connections, each using perConn descriptors
// in this process (2 when the target runs in-process), fit the descriptor
// limit; the error says how many do.
func (t *T) NeedFiles(conns, perConn int) error {
	if t.FileLimit == 0 || perConn < 1 {
		return nil
	}
	need := uint64(conns*perConn + FileReserve)
	if need <= t.FileLimit {
		return nil
	}
	most := (int(t.FileLimit) - FileReserve) / perConn
	return Usage(fmt.Errorf("loadtest: %d connections need about %d open files but RLIMIT_NOFILE is %d (the hard limit): use at most %d connections per process, or split the load over several processes",
		conns, need, t.FileLimit, max(most, 0)))
}

// Run executes the scenario within the options' bounds, then evaluates the
// thresholds and builds the summary. An error means the run could not
// start (bad options, unknown threshold metric); a scenario failure is in
// Summary.Err.
func Run(ctx context.Context, sc Scenario, opts Options) (*Summary, error) {
	if opts.Duration == 0 {
		opts.Duration = 10 * time.Second
	}
	if opts.Duration < 0 || opts.Duration > MaxExecutorDuration {
		return nil, fmt.Errorf("loadtest: duration must be in (0, %s]", MaxExecutorDuration)
	}
	if opts.MaxDuration == 0 {
		opts.MaxDuration = opts.Duration + DefaultRunOverhead
	}
	if err := CheckMaxDuration(opts.MaxDuration); err != nil {
		return nil, err
	}
	if opts.MaxDuration < opts.Duration {
		return nil, errors.New("loadtest: max duration is shorter than the duration")
	}
	if opts.SourceRange == "" {
		opts.SourceRange = DefaultSourceRange
	}
	src, err := ParseSourceRange(opts.SourceRange)
	if err != nil {
		return nil, err
	}
	ths, err := ParseThresholds(opts.Thresholds)
	if err != nil {
		return nil, err
	}
	reg := NewRegistry()
	if d, ok := sc.(MetricDeclarer); ok {
		d.DeclareMetrics(reg)
	}
	var bindErrs []error
	for i := range ths {
		bindErrs = append(bindErrs, ths[i].Bind(reg))
	}
	if err := errors.Join(bindErrs...); err != nil {
		return nil, err
	}
	limit, err := RaiseFileLimit()
	if err != nil {
		return nil, fmt.Errorf("loadtest: raise RLIMIT_NOFILE: %w", err)
	}

	if opts.Progress != nil {
		opts.Progress = &lockedWriter{w: opts.Progress}
	}
	t := &T{Opts: opts, Reg: reg, Src: src, FileLimit: limit, logw: opts.Progress}
	sum := &Summary{Scenario: sc.Name(), Target: opts.Target, Started: time.Now()}
	rctx, cancel := context.WithTimeout(ctx, opts.MaxDuration)
	defer cancel()

	stopProgress := startProgress(t, opts)
	runErr := sc.Run(rctx, t)
	stopProgress()
	if ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		// Whatever failed once the bound passed failed because of it: the
		// report names the bound first, then what was cut short.
		runErr = boundHit(opts.MaxDuration, runErr)
	}

	sum.Snapshot = reg.Snapshot()
	for _, th := range ths {
		sum.Thresholds = append(sum.Thresholds, th.Evaluate(sum.Snapshot))
	}
	t.mu.Lock()
	sum.Info = append([]Info(nil), t.info...)
	t.mu.Unlock()
	sum.Err = runErr
	return sum, nil
}

// boundHit is the error of a run its MaxDuration ended; err is what the
// scenario returned, if anything.
func boundHit(bound time.Duration, err error) error {
	if err == nil {
		return fmt.Errorf("loadtest: the run hit its %s bound", bound)
	}
	return fmt.Errorf("loadtest: the run hit its %s bound: %w", bound, err)
}

// startProgress prints the live progress line until the returned func is
// called.
func startProgress(t *T, opts Options) func() {
	w := opts.Progress
	if w == nil {
		return func() {}
	}
	tty := isTerminal(w)
	every := opts.ProgressInterval
	if every <= 0 {
		every = 5 * time.Second
		if tty {
			every = time.Second
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if tty {
					fmt.Fprint(w, "\r\033[K")
				}
				return
			case <-tick.C:
				line := progressLine(t)
				if tty {
					fmt.Fprint(w, "\r\033[K"+line)
				} else {
					fmt.Fprintln(w, line)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func progressLine(t *T) string {
	s := t.Reg.Snapshot()
	m := s.Metrics
	parts := []string{fmt.Sprintf("[%6s]", s.Elapsed.Round(100*time.Millisecond))}
	if p := t.currentPhase(); p != "" {
		parts = append(parts, p)
	}
	if v := m[MetricVUs]; v.set {
		parts = append(parts, fmt.Sprintf("vus %d", int(v.Value)))
	}
	if v := m[MetricWSOpen]; v.set {
		parts = append(parts, fmt.Sprintf("ws %d open", int(v.Value)))
	}
	if v := m[MetricIterations]; v.Count > 0 {
		parts = append(parts, fmt.Sprintf("iters %d", v.Count))
	}
	if v := m[MetricHTTPReqs]; v.Count > 0 {
		parts = append(parts, fmt.Sprintf("http %d (%s/s)", v.Count, formatFloat(v.Rate)))
	}
	if v := m[MetricDeliveryReceived]; v.Count > 0 {
		exp := m[MetricDeliveryExpected].Count
		parts = append(parts, fmt.Sprintf("delivered %d/%d", v.Count, exp))
		if l := m[MetricDeliveryLatency]; l.Count > 0 {
			parts = append(parts, "p99 "+formatDuration(l.Percentile(99)))
		}
	}
	if v := m[MetricErrors]; v.Count > 0 {
		parts = append(parts, fmt.Sprintf("errors %d", v.Count))
	}
	return strings.Join(parts, " · ")
}

// lockedWriter serialises the progress line and Logf.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func isTerminal(w io.Writer) bool {
	if l, ok := w.(*lockedWriter); ok {
		w = l.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
