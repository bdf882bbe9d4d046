package scenarios

import (
	"context"
	"flag"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// Broadcast measures fan-out alone: connections subscribe to dialogs and a
// publisher puts events (payload-byte data) straight onto the dialogs'
// channels at a fixed aggregate rate — the gateway's event frames by Redis
// PUBLISH for the gateway, Centrifugo's publication messages by PUBLISH into
// its Redis engine's channels for Centrifugo, the /publish socket for the
// baseline. Latency is measured on every subscriber from each event's
// scheduled send time.
type Broadcast struct {
	conns, dialogs, subsPerConn int
	rate, payload, publishers   int
	maxPublishers               int
	publisherConns, concurrency int
	drain                       time.Duration
	compare                     string
	faultDropEvery              int64
	faultFailEvery              int64
	stepRates                   string
	steps                       []int
	stepP99                     time.Duration
	warmup                      time.Duration
	cpu                         loadtest.ProcCPU
	gw                          gatewayFlags
	// faults wraps the publisher once it is up (tests: a publish skipped
	// or sent twice at a chosen point of the run).
	faults func(publisher) publisher
}

// Describe implements Scenario.
func (b *Broadcast) Describe() string {
	return "fan-out alone: events published straight to the dialogs' channels at a fixed rate; deliveries/s, p99 from schedule, loss"
}

// Name implements loadtest.Scenario.
func (b *Broadcast) Name() string { return "broadcast" }

// Flags implements Scenario.
func (b *Broadcast) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&b.conns, "conns", 50, "WebSocket connections")
	fs.IntVar(&b.dialogs, "dialogs", 5, "dialogs (channels) the connections spread over")
	fs.IntVar(&b.subsPerConn, "subs-per-conn", 1, "dialogs each connection subscribes to")
	fs.IntVar(&b.rate, "rate", 100, "events published per second, all dialogs together (deliveries/s = rate × subscribers per dialog)")
	fs.IntVar(&b.payload, "payload", 128, "bytes of each event's data object")
	fs.IntVar(&b.publishers, "publishers", 8, "publisher VUs started up front")
	fs.IntVar(&b.maxPublishers, "max-publishers", 256, "most publisher VUs: a due event with every VU busy gets a new one up to this, else it is dropped (dropped_iterations)")
	fs.IntVar(&b.publisherConns, "publisher-conns", 4, "publish sockets to a baseline target")
	fs.IntVar(&b.concurrency, "connect-concurrency", 64, "connections set up at a time")
	fs.DurationVar(&b.drain, "drain", 3*time.Second, "how long to wait for in-flight deliveries after the last publish")
	fs.StringVar(&b.compare, "compare", "", "run the same shape against this baseline first (baseline or baseline-inprocess) and report the ratio")
	fs.StringVar(&b.stepRates, "step-rates", "", "comma-separated publish rates measured one after another on the same connections (each for -duration) while p99 ≤ -step-p99 with no loss: sets max_delivery_rate")
	fs.DurationVar(&b.stepP99, "step-p99", 100*time.Millisecond, "the p99 (from schedule) a step must hold")
	fs.DurationVar(&b.warmup, "warmup", 0, "with -step-rates: publish at the first step's rate this long before the steps, unmeasured, then collect the generator's garbage "+
		"(the connections' first deliveries and the heap the set-up grew are not counted against the first step; its lost and duplicated deliveries are, in the run's totals)")
	fs.Var(&b.cpu, "cpu-pid", "name=PID (name=PID+: with its children): report that process's CPU-seconds per 1M unique deliveries of each measured phase (info <label>_cpu_s_per_1m_<name>); repeatable; the generator's own is always reported")
	fs.Int64Var(&b.faultDropEvery, "fault-drop-every", 0, "fault injection: a baseline this run starts drops every n-th delivery (proves the thresholds catch loss)")
	fs.Int64Var(&b.faultFailEvery, "fault-fail-publish-every", 0, "fault injection: every n-th publish is sent, then reported failed (proves its deliveries are not taken for expected ones and that a step with a failed publish does not hold)")
	b.gw.register(fs, getenv, true)
	b.gw.registerCentrifugo(fs)
}

// Metrics of the comparison.
const (
	MetricBaselineDeliveryRate = "baseline_delivery_rate" // gauge: the baseline's unique deliveries/s in the same run
	MetricBaselineRatio        = "baseline_ratio"         // gauge: target delivery_rate ÷ baseline_delivery_rate
	MetricMaxDeliveryRate      = "max_delivery_rate"      // gauge: with -step-rates, the highest step's deliveries/s that held p99 and no loss
)

// DeclareMetrics implements loadtest.MetricDeclarer.
func (b *Broadcast) DeclareMetrics(reg *loadtest.Registry) {
	reg.Gauge(MetricBaselineDeliveryRate, loadtest.UnitPerSecond)
	reg.Gauge(MetricBaselineRatio, loadtest.UnitRatio)
	reg.Gauge(MetricMaxDeliveryRate, loadtest.UnitPerSecond)
}

func (b *Broadcast) shape() shape { return shape{b.conns, b.dialogs, b.subsPerConn} }

// check validates the flags against opts and parses -step-rates.
func (b *Broadcast) check(opts loadtest.Options) error {
	if b.payload < loadtest.MinEventPayload || b.payload > 16<<10 {
		return fmt.Errorf("-payload must be %d..16384", loadtest.MinEventPayload)
	}
	if b.rate < 1 || b.publishers < 1 || b.maxPublishers < b.publishers || b.maxPublishers > maxAuxConns ||
		b.publisherConns < 1 || b.publisherConns > 64 || b.concurrency < 1 || b.drain < 0 {
		return fmt.Errorf("-rate, -publishers, -connect-concurrency must be positive, -publishers ≤ -max-publishers ≤ %d, -publisher-conns 1..64, -drain ≥ 0", maxAuxConns)
	}
	steps, err := parseRates(b.stepRates)
	if err != nil {
		return err
	}
	b.steps = steps
	if len(b.steps) > 0 && b.stepP99 <= 0 {
		return fmt.Errorf("-step-p99 must be positive")
	}
	if b.warmup < 0 || (b.warmup > 0 && len(b.steps) == 0) {
		return fmt.Errorf("-warmup needs -step-rates and must not be negative")
	}
	if b.compare != "" && b.compare != TargetBaseline && b.compare != TargetBaselineInProcess {
		return fmt.Errorf("-compare %q: want %s or %s", b.compare, TargetBaseline, TargetBaselineInProcess)
	}
	if err := checkEventsPerDialog(b.rate, b.steps, opts.Duration, b.warmup, b.dialogs); err != nil {
		return err
	}
	if err := b.cpu.Check(); err != nil {
		return err
	}
	return b.shape().validate(false)
}

// Run implements loadtest.Scenario.
func (b *Broadcast) Run(ctx context.Context, t *loadtest.T) error {
	if err := b.check(t.Opts); err != nil {
		return loadtest.Usage(err)
	}
	if b.faultDropEvery > 0 {
		prev := BaselineConfig.DropEvery
		BaselineConfig.DropEvery = b.faultDropEvery
		defer func() { BaselineConfig.DropEvery = prev }()
		t.Info("fault_drop_every", b.faultDropEvery)
	}
	sh := b.shape()
	subs := sh.subscribers()
	total := 0
	for _, n := range subs {
		total += n
	}
	t.Info("conns", b.conns)
	t.Info("dialogs", b.dialogs)
	t.Info("subscribers_per_dialog", float64(total)/float64(b.dialogs))
	if len(b.steps) == 0 {
		t.Info("publish_rate", b.rate)
		t.Info("offered_delivery_rate", float64(b.rate)*float64(total)/float64(b.dialogs))
	} else {
		t.Info("step_rates", b.stepRates)
		t.Info("step_p99_limit", b.stepP99)
	}
	t.Info("payload_bytes", b.payload)
	baseRate, err := 0.0, error(nil)
	if b.compare != "" {
		breg := loadtest.NewRegistry()
		t.Logf("broadcast: baseline phase (%s)", b.compare)
		if baseRate, err = b.phase(ctx, t, b.compare, breg, "baseline"); err != nil {
			return fmt.Errorf("baseline phase: %w", err)
		}
		t.Reg.Gauge(MetricBaselineDeliveryRate, loadtest.UnitPerSecond).Set(baseRate)
		if len(b.steps) == 0 {
			bs := breg.Snapshot()
			if p99 := bs.Metrics[loadtest.MetricDeliveryLatency].Percentile(99); math.IsInf(p99, 1) {
				t.Info("baseline_delivery_p99", latencyString(p99))
			} else {
				t.Info("baseline_delivery_p99", time.Duration(p99))
			}
			t.Info("baseline_delivery_lost", bs.Metrics[loadtest.MetricDeliveryLost].Count)
		}
	}
	got, err := b.phase(ctx, t, t.Opts.Target, t.Reg, "target")
	if err != nil {
		return err
	}
	if len(b.steps) > 0 {
		t.Reg.Gauge(MetricMaxDeliveryRate, loadtest.UnitPerSecond).Set(got)
	}
	if b.compare != "" && baseRate > 0 {
		t.Reg.Gauge(MetricBaselineRatio, loadtest.UnitRatio).Set(got / baseRate)
	}
	return nil
}

// checkEventsPerDialog refuses a plan with a measurement (the run at
// rate, each step, the warm-up) that puts more events into one dialog
// than the delivery accounting can match.
func checkEventsPerDialog(rate int, steps []int, dur, warmup time.Duration, dialogs int) error {
	if len(steps) > 0 {
		rate = slices.Max(steps)
	}
	if err := loadtest.CheckEventsPerDialog(rate, dur, dialogs); err != nil {
		return err
	}
	if warmup > 0 {
		return loadtest.CheckEventsPerDialog(steps[0], warmup, dialogs)
	}
	return nil
}

// stepper publishes events of the shape; it keeps per-dialog seqs across
// measurement steps on the same connections.
type stepper struct {
	b        *Broadcast
	fl       *fleet
	pub      publisher
	seqs     []atomic.Int64
	channels []string
	// centrifugo: publish Centrifugo publications instead of gateway
	// event frames.
	centrifugo bool
}

// phase sets the shape up against spec and measures it: once at -rate
// (recording into reg), or at each of -step-rates while p99 and loss hold.
// It returns the delivery rate the comparison uses: the measured one, or
// the highest step that held.
func (b *Broadcast) phase(ctx context.Context, t *loadtest.T, spec string, reg *loadtest.Registry, label string) (float64, error) {
	var dl *loadtest.Deliveries
	if len(b.steps) == 0 {
		dl = loadtest.NewDeliveries(reg)
	}
	st, closeAll, err := b.open(ctx, t, spec, reg, dl, label)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	if len(b.steps) == 0 {
		cpu, err := st.measure(ctx, t, reg, dl, b.rate, t.Opts.Duration, label)
		if err != nil {
			return 0, err
		}
		for _, name := range sortedKeys(cpu) {
			t.Info(label+"_cpu_s_per_1m_"+name, cpu[name])
		}
		return reg.Gauge(loadtest.MetricDeliveryRate, loadtest.UnitPerSecond).Value(), nil
	}
	return st.climb(ctx, t, reg, label)
}

// deliveryCounts are the delivery accounting of a phase: what was
// expected, what arrived, and what was lost, doubled or not expected.
var deliveryCounts = []string{loadtest.MetricDeliveryExpected, loadtest.MetricDeliveryReceived, loadtest.MetricDeliveryLost,
	loadtest.MetricDeliveryDuplicates, loadtest.MetricDeliveryUnexpected}

// addStepTotals adds one measured step's delivery accounting to the run's
// registry run, so that thresholds such as delivery_lost==0 or
// publish_failed<1% judge every step together. Latency and delivery_rate
// stay per step (in the step lines).
func addStepTotals(run, step *loadtest.Registry) {
	addTotals(run, step, slices.Concat(deliveryCounts, []string{loadtest.MetricWSEventsOther, loadtest.MetricIterations, loadtest.MetricDroppedIterations}),
		loadtest.MetricDeliveryLoss, loadtest.MetricPublishFailed)
}

// addWarmupTotals adds the warm-up's delivery accounting to the run's
// registry run. The warm-up is unmeasured for speed (its latency,
// delivery_rate, publishes, dropped iterations and publish failures stay
// out of the figures), not for correctness: an event it lost or delivered
// twice is lost or duplicated all the same, so delivery_lost==0 and
// delivery_duplicates==0 judge it as they judge the steps.
func addWarmupTotals(run, warm *loadtest.Registry) {
	addTotals(run, warm, deliveryCounts, loadtest.MetricDeliveryLoss)
}

// addTotals adds the counters and rates of phase to run. A counter the
// phase never recorded into stays unrecorded in run (a measured counter
// such as delivery_lost has no data until a phase measured it).
func addTotals(run, phase *loadtest.Registry, counters []string, rates ...string) {
	for _, n := range counters {
		if c := phase.Counter(n); c.Recorded() {
			run.Counter(n).Add(c.Value())
		}
	}
	for _, n := range rates {
		r := phase.Rate(n)
		_, total := r.Value()
		run.Rate(n).AddN(r.Hits(), total)
	}
}

// open connects the shape's fleet to spec and the publisher; closeAll
// tears both down.
func (b *Broadcast) open(ctx context.Context, t *loadtest.T, spec string, reg *loadtest.Registry, dl *loadtest.Deliveries, label string) (*stepper, func(), error) {
	tg, err := openTargets(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	var (
		fl       *fleet
		pub      publisher
		st       *stepper // set once everything is up
		closeAll func()
	)
	closeAll = func() {
		if st != nil { // set up completely: report what the run lost
			if open := fl.stillOpen(); open < b.conns {
				t.Info(label+"_connections_dropped", b.conns-open)
			}
			t.SetPhase(label + ": closing")
		}
		if pub != nil {
			pub.Close()
		}
		if fl != nil {
			fl.close(ctx, b.concurrency)
		}
		tg.close()
	}
	ok := false
	defer func() {
		if !ok {
			closeAll()
		}
	}()
	t.Info(label, tg.describe())
	sh := b.shape()
	if err := sh.validate(tg.gateway); err != nil {
		return nil, nil, loadtest.Usage(err)
	}
	// Publisher sockets and Redis connections (≤ -max-publishers) come out
	// of loadtest.FileReserve.
	if err := t.NeedFiles(b.conns, tg.perConnFiles()); err != nil {
		return nil, nil, err
	}
	switch {
	case tg.gateway:
		err = b.gw.check()
	case tg.centrifugo:
		err = b.gw.checkCentrifugo()
	}
	if err != nil {
		return nil, nil, loadtest.Usage(err)
	}
	cfg := fleetConfig{shape: sh, concurrency: b.concurrency, gw: &b.gw, reg: reg, deliveries: dl}
	if fl, err = prepare(ctx, t, tg, cfg); err != nil {
		return nil, nil, err
	}
	if err := fl.connect(ctx, t, tg, cfg); err != nil {
		return nil, nil, err
	}
	if tg.gateway || tg.centrifugo {
		pub, err = newRedisPublisher(ctx, b.gw.redisURL, b.gw.pubsubMode, b.maxPublishers)
	} else {
		pub, err = newBaselinePublisher(ctx, t, tg.base, b.publisherConns)
	}
	if err != nil {
		return nil, nil, err
	}
	pub = b.withFaults(pub)
	st = &stepper{b: b, fl: fl, pub: pub, seqs: make([]atomic.Int64, b.dialogs), channels: make([]string, b.dialogs),
		centrifugo: tg.centrifugo}
	for d, id := range fl.dialogIDs {
		st.channels[d] = loadtest.DialogChannelPrefix + id
		if tg.centrifugo {
			st.channels[d] = loadtest.CentrifugoRedisChannel(b.gw.cfPrefix, loadtest.CentrifugoChannel(id))
		}
	}
	ok = true
	return st, closeAll, nil
}

// withFaults wraps pub in the fault injections of the run: reported
// failures (-fault-fail-publish-every), then the faults a test set.
func (b *Broadcast) withFaults(pub publisher) publisher {
	if b.faultFailEvery > 0 {
		pub = &failingPublisher{publisher: pub, every: uint64(b.faultFailEvery)}
	}
	if b.faults != nil {
		pub = b.faults(pub)
	}
	return pub
}

// climb measures each of -step-rates on the same connections until one
// does not hold p99 with no loss, drop or failed publish, and returns the
// highest step's deliveries/s that held. Each step's delivery counts, and
// those of the warm-up, are added to reg.
func (st *stepper) climb(ctx context.Context, t *loadtest.T, reg *loadtest.Registry, label string) (float64, error) {
	b, fl := st.b, st.fl
	if b.warmup > 0 {
		wreg := loadtest.NewRegistry()
		wdl := loadtest.NewDeliveries(wreg)
		st.continueSeqs(wdl)
		fl.dialer.SetDeliveries(wdl)
		if _, err := st.measure(ctx, t, wreg, wdl, b.steps[0], b.warmup, label+" warm-up"); err != nil {
			return 0, err
		}
		addWarmupTotals(reg, wreg)
		m := wreg.Snapshot().Metrics
		t.Info(label+"_warmup", fmt.Sprintf("%d events/s for %s: %.0f deliveries/s, p99 %s, lost %d, duplicates %d, unexpected %d",
			b.steps[0], b.warmup, m[loadtest.MetricDeliveryRate].Value,
			latencyString(m[loadtest.MetricDeliveryLatency].Percentile(99)), m[loadtest.MetricDeliveryLost].Count,
			m[loadtest.MetricDeliveryDuplicates].Count, m[loadtest.MetricDeliveryUnexpected].Count))
		// The heap the set-up and the warm-up grew is collected now, not
		// in the middle of the first step.
		runtime.GC()
	}
	best := 0.0
	for i, rate := range b.steps {
		sreg := loadtest.NewRegistry()
		sdl := loadtest.NewDeliveries(sreg)
		st.continueSeqs(sdl)
		fl.dialer.SetDeliveries(sdl)
		cpu, err := st.measure(ctx, t, sreg, sdl, rate, t.Opts.Duration, fmt.Sprintf("%s step %d/%d (%d events/s)", label, i+1, len(b.steps), rate))
		if err != nil {
			return best, err
		}
		addStepTotals(reg, sreg)
		m := sreg.Snapshot().Metrics
		got := m[loadtest.MetricDeliveryRate].Value
		p99 := m[loadtest.MetricDeliveryLatency].Percentile(99) // +Inf when dropped events reach the rank
		lost, dropped := m[loadtest.MetricDeliveryLost].Count, m[loadtest.MetricDroppedIterations].Count
		failed := sreg.Rate(loadtest.MetricPublishFailed).Hits()
		// A step holds only when nothing was lost, dropped or refused: a
		// publish that failed or was dropped is an event the step did not
		// carry (publish_failed counts the dropped ones too).
		held := p99 <= float64(b.stepP99) && lost == 0 && dropped == 0 && failed == 0 && m[loadtest.MetricDeliveryLatency].Count > 0
		line := fmt.Sprintf("%.0f deliveries/s, p99 %s, lost %d, dropped %d, publish failures %d, held %v",
			got, latencyString(p99), lost, dropped, failed, held)
		for _, name := range sortedKeys(cpu) {
			line += fmt.Sprintf(", %s %.3f CPU-s/1M deliveries", name, cpu[name])
		}
		t.Info(fmt.Sprintf("%s_step_%d", label, rate), line)
		if !held {
			break
		}
		best = got
	}
	fl.dialer.SetDeliveries(nil)
	return best, nil
}

// continueSeqs tells dl, a new measurement on the same connections,
// which seqs of each dialog earlier measurements published: one of those
// arriving late stays lost there and is not counted in dl.
func (st *stepper) continueSeqs(dl *loadtest.Deliveries) {
	for d, id := range st.fl.dialogIDs {
		dl.After(id, st.seqs[d].Load())
	}
}

// measure publishes at rate for dur, drains and records the
// deliveries into reg. It returns the CPU-seconds per 1M unique deliveries
// each -cpu-pid process (and the generator) used from the first publish to
// the end of the drain.
func (st *stepper) measure(ctx context.Context, t *loadtest.T, reg *loadtest.Registry, dl *loadtest.Deliveries, rate int, dur time.Duration, label string) (map[string]float64, error) {
	b := st.b
	exec := loadtest.ConstantArrivalRate{Rate: rate, Duration: dur,
		PreAllocatedVUs: b.publishers, MaxVUs: b.maxPublishers,
		// A dropped event is a failed publish whose deliveries never
		// happen: each ranks above every measured delivery.
		OnDrop: func(it loadtest.Iter) { dl.Dropped(st.fl.subs[int(it.N%int64(b.dialogs))]) }}
	bufs := make([][]byte, exec.PeakVUs())
	data := make([][]byte, len(bufs)) // Centrifugo: the publication's data
	t.SetPhase(label + ": publishing")
	cpu0 := b.cpu.Sample()
	reg.ResetClock()
	_, err := exec.Run(ctx, reg, func(ctx context.Context, it loadtest.Iter) error {
		d := int(it.N % int64(b.dialogs))
		seq := st.seqs[d].Add(1)
		if st.centrifugo {
			data[it.VU] = loadtest.AppendCentrifugoData(data[it.VU][:0], seq, it.Scheduled.UnixNano(), b.payload)
			bufs[it.VU] = loadtest.AppendCentrifugoPublication(bufs[it.VU][:0], data[it.VU], time.Now().UnixMilli())
		} else {
			bufs[it.VU] = loadtest.AppendEvent(bufs[it.VU][:0], st.fl.dialogIDs[d], ids.New(), seq, it.Scheduled.UnixNano(), b.payload)
		}
		if err := st.pub.Publish(ctx, st.channels[d], bufs[it.VU]); err != nil {
			dl.PublishFailed()
			return err
		}
		dl.Published(st.fl.dialogIDs[d], seq, st.fl.subs[d])
		return nil
	})
	if err != nil {
		return nil, err
	}
	t.SetPhase(label + ": draining")
	dl.Drain(ctx, b.drain)
	reg.StopClock()
	// ms per delivery × 1000 = seconds per 1M deliveries
	cpu := b.cpu.Sample().PerOp(cpu0, dl.Received())
	for name := range cpu {
		cpu[name] *= 1000
	}
	dl.Finish(reg.Elapsed())
	return cpu, ctx.Err()
}

// latencyString renders a latency percentile in nanoseconds for a step or
// info line: ∞ when dropped iterations reach its rank.
func latencyString(ns float64) string {
	if math.IsInf(ns, 1) {
		return "∞"
	}
	return time.Duration(ns).Round(10 * time.Microsecond).String()
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
