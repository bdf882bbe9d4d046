package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// The send path's metrics, shared by chat-fanout (over the gateway) and
// send-sql (the store's send function on a pgx pool, no HTTP, no Redis).
const (
	MetricSendLatency = "send_latency"  // trend: scheduled send time → the send answered, accepted sends; dropped sends as unbounded samples
	MetricSendsOK     = "sends_ok"      // counter: sends accepted
	MetricSendsFailed = "sends_failed"  // counter: sends refused, failed (every status, 429 and 503 too) or dropped by the generator
	MetricSendRate    = "send_rate"     // gauge: accepted sends per second of the measured run (with steps: of the highest held step)
	MetricMaxSendRate = "max_send_rate" // gauge: with -step-rates, the highest offered rate that held
	// History reconciliation: every accepted send must be in its dialog's
	// history exactly once, at the seq its answer named, in the order the
	// sends were acknowledged.
	MetricHistoryMissing    = "history_missing"
	MetricHistoryDuplicates = "history_duplicates"
	MetricHistoryReordered  = "history_reordered"
)

// HeldFraction is the share of a step's offered sends that must be accepted
// for the step to hold.
const HeldFraction = 0.99

// sendFlags are the shape, schedule and check settings of a send-path
// scenario.
type sendFlags struct {
	users, dialogs, dialogsPerUser int
	hot, sendOnly                  bool
	rate, bodySize                 int
	senders, maxSenders            int
	concurrency                    int
	stepRates                      string
	steps                          []int
	stepP99                        time.Duration
	warmup                         time.Duration
	cpu                            loadtest.ProcCPU
	reconcile                      bool
}

func (f *sendFlags) register(fs *flag.FlagSet, sockets bool) {
	what := "users"
	if sockets {
		what = "users, each with one connection (unless -send-only)"
	}
	fs.IntVar(&f.users, "users", 100, what)
	fs.IntVar(&f.dialogs, "dialogs", 10, "dialogs (-hot-dialog: 1)")
	fs.IntVar(&f.dialogsPerUser, "dialogs-per-user", 1, "dialogs each user is a member of")
	fs.BoolVar(&f.hot, "hot-dialog", false, "all users are members of one dialog and every send goes into it (-users 2..100)")
	fs.IntVar(&f.rate, "rate", 20, "messages sent per second, all dialogs together (without -step-rates)")
	fs.IntVar(&f.bodySize, "body", 128, "message body size in bytes")
	fs.IntVar(&f.senders, "senders", 16, "sender VUs started up front")
	fs.IntVar(&f.maxSenders, "max-senders", 512, "most sender VUs (a due send with every VU busy gets a new one up to this, else it is dropped)")
	fs.IntVar(&f.concurrency, "connect-concurrency", 32, "users/dialogs/connections set up at a time")
	fs.StringVar(&f.stepRates, "step-rates", "", "comma-separated send rates measured one after another with the same users and dialogs (each for -duration) until one does not hold: sets max_send_rate")
	fs.DurationVar(&f.stepP99, "step-p99", 100*time.Millisecond, "the p99 of send_latency (from the scheduled send time) a step must hold")
	fs.DurationVar(&f.warmup, "warmup", 0, "with -step-rates: send at the first step's rate this long before the steps, unmeasured (pools, caches and PostgreSQL's buffers warm)")
	fs.Var(&f.cpu, "cpu-pid", "name=PID (name=PID+: with its children, as PostgreSQL's postmaster): report that process's CPU per send of each measured step (step info cpu_<rate>, ms per send); repeatable; the generator's own is always reported")
	fs.BoolVar(&f.reconcile, "reconcile", true, "read every dialog's history afterwards: count accepted messages it lacks, holds twice or out of order")
}

// check validates the flags and parses -step-rates.
func (f *sendFlags) check() error {
	if f.rate < 1 || f.senders < 1 || f.maxSenders < f.senders || f.maxSenders > maxAuxConns || f.concurrency < 1 || f.bodySize < 32 || f.bodySize > 4000 {
		return fmt.Errorf("-rate, -senders, -connect-concurrency must be positive, -senders ≤ -max-senders ≤ %d and -body 32..4000", maxAuxConns)
	}
	steps, err := parseRates(f.stepRates)
	if err != nil {
		return err
	}
	f.steps = steps
	if len(f.steps) > 0 && f.stepP99 <= 0 {
		return errors.New("-step-p99 must be positive")
	}
	if f.warmup < 0 || (f.warmup > 0 && len(f.steps) == 0) {
		return errors.New("-warmup needs -step-rates and must not be negative")
	}
	if err := f.cpu.Check(); err != nil {
		return err
	}
	if f.hot && (f.users < 2 || f.users > maxDialogMembers) {
		return fmt.Errorf("-hot-dialog needs -users 2..%d (one dialog holds every user)", maxDialogMembers)
	}
	return f.shape().validate(true)
}

// parseRates reads a comma-separated list of rates.
func parseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		r, err := strconv.Atoi(f)
		if err != nil || r < 1 || r > loadtest.MaxArrivalRate {
			return nil, fmt.Errorf("-step-rates: %q is not a rate in 1..%d", f, loadtest.MaxArrivalRate)
		}
		out = append(out, r)
	}
	return out, nil
}

func (f *sendFlags) shape() shape {
	if f.hot {
		return shape{f.users, 1, 1}
	}
	return shape{f.users, f.dialogs, f.dialogsPerUser}
}

func declareSendMetrics(reg *loadtest.Registry) {
	for _, n := range []string{MetricSendsOK, MetricSendsFailed, MetricHistoryMissing, MetricHistoryDuplicates, MetricHistoryReordered} {
		reg.Counter(n)
	}
	// The history check measures only accepted sends: without one (or
	// with -reconcile=false) it has no result to judge.
	reg.DeclareMeasured(MetricHistoryMissing, MetricHistoryDuplicates, MetricHistoryReordered)
	reg.Trend(MetricSendLatency)
	reg.Gauge(MetricSendRate, loadtest.UnitPerSecond)
	reg.Gauge(MetricMaxSendRate, loadtest.UnitPerSecond)
}

// sent is one accepted send, kept for the history check.
type sent struct {
	id          string
	seq         int64
	marker      int64 // the body's scheduled-time marker
	start, done time.Time
}

// sendFunc sends body as user sender into dialog d and returns the stored
// message's id and seq.
type sendFunc func(ctx context.Context, d, sender int, body string) (id string, seq int64, err error)

// sendRun drives sends of one shape, once or per step, and keeps what was
// accepted for the history check.
type sendRun struct {
	f       *sendFlags
	members [][]int
	send    sendFunc
	status  func(error) string     // a failed send's label in the per-step error counts
	onOK    func(d int, seq int64) // after an accepted send (chat-fanout: expect its deliveries)
	onFail  func()
	onDrop  func(d int) // after a send into dialog d the generator dropped (chat-fanout: its deliveries never happen)

	mu       sync.Mutex // guards accepted
	accepted [][]sent   // per dialog
}

func newSendRun(f *sendFlags, send sendFunc, status func(error) string) *sendRun {
	sh := f.shape()
	return &sendRun{f: f, members: sh.members(), send: send, status: status, accepted: make([][]sent, sh.dialogs)}
}

// pick is the dialog and sender of iteration n: dialogs in turn, each
// dialog's members in turn.
func (r *sendRun) pick(n int64) (d, sender int) {
	nd := int64(len(r.members))
	d = int(n % nd)
	m := r.members[d]
	return d, m[int(n/nd)%len(m)]
}

// stepResult is what one measured rate gave.
type stepResult struct {
	rate              int
	offered, ok       int64
	errs              map[string]int64 // failed sends by status
	p50, p99          float64          // ns from schedule; +Inf when dropped sends reach the rank
	throughput        float64          // accepted sends per second
	held              bool
	stepped           bool // measured as a step: held applies
	droppedIterations int64
	cpu               map[string]float64 // CPU ms per accepted send, per -cpu-pid process and the generator
}

func (s stepResult) String() string {
	keys := make([]string, 0, len(s.errs))
	for k := range s.errs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []string
	for _, k := range keys {
		errs = append(errs, fmt.Sprintf("%s:%d", k, s.errs[k]))
	}
	e := "none"
	if len(errs) > 0 {
		e = strings.Join(errs, ",")
	}
	out := fmt.Sprintf("offered %d, ok %d, errors %s, dropped %d, p50 %s, p99 %s, %.1f sends/s",
		s.offered, s.ok, e, s.droppedIterations, latencyString(s.p50), latencyString(s.p99), s.throughput)
	if s.stepped {
		out += fmt.Sprintf(", held %v", s.held)
	}
	if len(s.cpu) > 0 {
		names := make([]string, 0, len(s.cpu))
		for n := range s.cpu {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			out += fmt.Sprintf(", %s %.3f CPU-ms/send", n, s.cpu[n])
		}
	}
	return out
}

// measure sends at rate for dur. Latency, accepted and failed sends go to
// t.Reg (the whole run) and to the step's own figures, with the CPU the
// -cpu-pid processes used during the sending alone.
func (r *sendRun) measure(ctx context.Context, t *loadtest.T, rate int, dur time.Duration, label string) (stepResult, error) {
	f := r.f
	sreg := loadtest.NewRegistry()
	lat, runLat := sreg.Trend(MetricSendLatency), t.Reg.Trend(MetricSendLatency)
	okC, failC := t.Reg.Counter(MetricSendsOK), t.Reg.Counter(MetricSendsFailed)
	var (
		ok    atomic.Int64
		emu   sync.Mutex
		errsC = map[string]int64{}
	)
	exec := loadtest.ConstantArrivalRate{Rate: rate, Duration: dur, PreAllocatedVUs: f.senders, MaxVUs: f.maxSenders,
		// A dropped send is a failed send whose latency never ends: it
		// ranks above every answered one in send_latency.
		OnDrop: func(it loadtest.Iter) {
			lat.AddDropped(1)
			runLat.AddDropped(1)
			failC.Inc()
			if r.onDrop != nil {
				d, _ := r.pick(it.N)
				r.onDrop(d)
			}
		}}
	t.SetPhase(label + ": sending")
	cpu0 := f.cpu.Sample()
	stats, err := exec.Run(ctx, sreg, func(ctx context.Context, it loadtest.Iter) error {
		d, sender := r.pick(it.N)
		marker := it.Scheduled.UnixNano()
		t0 := time.Now()
		id, seq, err := r.send(ctx, d, sender, loadtest.ChatBody(marker, f.bodySize))
		if err != nil {
			failC.Inc()
			emu.Lock()
			errsC[r.status(err)]++
			emu.Unlock()
			if r.onFail != nil {
				r.onFail()
			}
			return err
		}
		done := time.Now()
		lat.Add(done.Sub(it.Scheduled))
		runLat.Add(done.Sub(it.Scheduled))
		ok.Add(1)
		okC.Inc()
		r.mu.Lock()
		r.accepted[d] = append(r.accepted[d], sent{id: id, seq: seq, marker: marker, start: t0, done: done})
		r.mu.Unlock()
		if r.onOK != nil {
			r.onOK(d, seq)
		}
		return nil
	})
	cpu1 := f.cpu.Sample()
	// The executor counted into the step's registry; the run's totals too.
	t.Reg.Counter(loadtest.MetricIterations).Add(stats.Iterations)
	t.Reg.Counter(loadtest.MetricDroppedIterations).Add(stats.Dropped)
	res := stepResult{rate: rate, offered: exec.Planned(), ok: ok.Load(), errs: errsC, droppedIterations: stats.Dropped}
	res.cpu = cpu1.PerOp(cpu0, res.ok)
	if err != nil {
		return res, err
	}
	m := sreg.Snapshot().Metrics[MetricSendLatency]
	res.p50, res.p99 = m.Percentile(50), m.Percentile(99)
	res.throughput = float64(res.ok) / dur.Seconds()
	res.stepped = len(f.steps) > 0
	// A step holds when the target answered nearly every offered send in
	// time and the generator started every one of them: a dropped send is
	// one a user would have waited for without end.
	res.held = res.ok > 0 && float64(res.ok) >= math.Ceil(HeldFraction*float64(res.offered)) &&
		res.droppedIterations == 0 && res.p99 <= float64(f.stepP99)
	return res, ctx.Err()
}

// measureAll runs -rate once, or each of -step-rates until one does not
// hold, and sets send_rate and max_send_rate.
func (r *sendRun) measureAll(ctx context.Context, t *loadtest.T, name string) error {
	f := r.f
	if len(f.steps) == 0 {
		res, err := r.measure(ctx, t, f.rate, t.Opts.Duration, name)
		if err != nil {
			return err
		}
		t.Reg.Gauge(MetricSendRate, loadtest.UnitPerSecond).Set(res.throughput)
		t.Info("send", res.String())
		return nil
	}
	t.Info("step_rates", f.stepRates)
	t.Info("step_p99_limit", f.stepP99)
	if f.warmup > 0 {
		res, err := r.measure(ctx, t, f.steps[0], f.warmup, name+" warm-up")
		if err != nil {
			return err
		}
		t.Info("warmup", res.String())
	}
	best := 0
	bestRate := 0.0
	for i, rate := range f.steps {
		res, err := r.measure(ctx, t, rate, t.Opts.Duration, fmt.Sprintf("%s step %d/%d (%d sends/s)", name, i+1, len(f.steps), rate))
		if err != nil {
			return err
		}
		t.Info(fmt.Sprintf("step_%d", rate), res.String())
		if len(res.cpu) > 0 {
			t.Info(fmt.Sprintf("cpu_%d", rate), res.cpu)
		}
		t.Logf("%s: step %d sends/s: %s", name, rate, res)
		if !res.held {
			break
		}
		best, bestRate = rate, res.throughput
	}
	t.Reg.Gauge(MetricMaxSendRate, loadtest.UnitPerSecond).Set(float64(best))
	t.Reg.Gauge(MetricSendRate, loadtest.UnitPerSecond).Set(bestRate)
	t.Info("max_send_rate", best)
	return nil
}

// stored is one message as its dialog's history holds it.
type stored struct {
	id     string
	seq    int64
	marker int64 // 0: not a load-generator message
}

// historyReader reads dialog d's history after seq, one page at a time;
// more reports whether another page follows.
type historyReader func(ctx context.Context, d int, after int64) (page []stored, more bool, err error)

// reconcile reads every dialog's history and counts accepted sends it
// lacks, holds twice or holds out of order.
func (r *sendRun) reconcile(ctx context.Context, t *loadtest.T, read historyReader) error {
	n := 0
	for _, acc := range r.accepted {
		n += len(acc)
	}
	if !r.f.reconcile || n == 0 {
		return nil
	}
	t.SetPhase("reconciling history")
	missing, dups, reord := t.Reg.Counter(MetricHistoryMissing), t.Reg.Counter(MetricHistoryDuplicates), t.Reg.Counter(MetricHistoryReordered)
	return forEach(ctx, len(r.accepted), r.f.concurrency, func(ctx context.Context, d int) error {
		var hist []stored
		var after int64
		for range 100_000 {
			page, more, err := read(ctx, d, after)
			if err != nil {
				return fmt.Errorf("history: %w", err)
			}
			hist = append(hist, page...)
			for _, m := range page {
				after = max(after, m.seq)
			}
			if !more || len(page) == 0 {
				break
			}
		}
		c := checkHistory(hist, r.accepted[d])
		missing.Add(c.missing)
		dups.Add(c.duplicates)
		reord.Add(c.reordered)
		return nil
	})
}

type historyCheck struct{ missing, duplicates, reordered int64 }

// checkHistory compares one dialog's history with its accepted sends:
//   - missing: an accepted message the history lacks;
//   - duplicates: a send stored more than once (the same body marker twice);
//   - reordered: seqs not strictly rising in the history, an accepted
//     message stored at another seq than its answer named, or a send that
//     was answered before another started holding the higher seq.
func checkHistory(hist []stored, acc []sent) historyCheck {
	var c historyCheck
	byID := make(map[string]int64, len(hist))
	markers := make(map[int64]bool, len(hist))
	var last int64
	for i, m := range hist {
		if i > 0 && m.seq <= last {
			c.reordered++
		}
		last = m.seq
		byID[m.id] = m.seq
		if m.marker != 0 {
			if markers[m.marker] {
				c.duplicates++
			}
			markers[m.marker] = true
		}
	}
	for _, a := range acc {
		seq, ok := byID[a.id]
		switch {
		case !ok:
			c.missing++
		case seq != a.seq:
			c.reordered++
		}
	}
	c.reordered += causalInversions(acc)
	return c
}

// causalInversions counts sends B for which some send A was answered
// before B started and yet got a higher seq than B.
func causalInversions(acc []sent) int64 {
	byStart := append([]sent(nil), acc...)
	byDone := append([]sent(nil), acc...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].start.Before(byStart[j].start) })
	sort.Slice(byDone, func(i, j int) bool { return byDone[i].done.Before(byDone[j].done) })
	var n int64
	var maxSeq int64
	j := 0
	for _, b := range byStart {
		for j < len(byDone) && byDone[j].done.Before(b.start) {
			maxSeq = max(maxSeq, byDone[j].seq)
			j++
		}
		if maxSeq > b.seq {
			n++
		}
	}
	return n
}
