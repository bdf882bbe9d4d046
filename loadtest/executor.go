package loadtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Iter describes one iteration handed to a scenario function.
type Iter struct {
	VU int   // 0-based virtual user running it
	N  int64 // 0-based iteration number across the executor
	// Scheduled is when the iteration was due. For the arrival-rate
	// executor this is its slot in the fixed schedule, so latency measured
	// from it includes any time the iteration waited (no coordinated
	// omission); for the VU executors it is the actual start.
	Scheduled time.Time
}

// IterFunc is the body of an iteration. An error is counted in the
// executor's Stats; it does not stop the run.
type IterFunc func(ctx context.Context, it Iter) error

// Executor schedules iterations, as k6's executors do. Run returns once the
// schedule is over and running iterations finished (or were cancelled
// after the graceful stop). Every executor is bounded in time.
type Executor interface {
	Run(ctx context.Context, reg *Registry, fn IterFunc) (Stats, error)
}

// Stats counts what an executor did.
type Stats struct {
	Iterations int64 // iterations started
	Failed     int64 // iterations whose function returned an error
	Dropped    int64 // arrival-rate slots skipped: every VU busy and MaxVUs reached
}

// DefaultGracefulStop is how long running iterations may finish once an
// executor's duration is over before their context is cancelled.
const DefaultGracefulStop = 2 * time.Second

// Bounds on any executor: a run always stops by itself.
const (
	MaxExecutorDuration = 2 * time.Hour
	MaxExecutorVUs      = 100_000
)

func gracefulOrDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultGracefulStop
	}
	return d
}

// runState is the bookkeeping shared by the executors.
type runState struct {
	reg        *Registry
	fn         IterFunc
	iterations *Counter
	duration   *Trend
	vus        *Gauge
	next       atomic.Int64
	failed     atomic.Int64
	started    atomic.Int64
}

func newRunState(reg *Registry, fn IterFunc) *runState {
	if reg == nil {
		reg = NewRegistry()
	}
	return &runState{reg: reg, fn: fn, iterations: reg.Counter(MetricIterations),
		duration: reg.Trend(MetricIterationDuration), vus: reg.Gauge(MetricVUs, UnitNone)}
}

func (s *runState) run(ctx context.Context, it Iter) {
	s.started.Add(1)
	s.iterations.Inc()
	t0 := time.Now()
	if err := s.fn(ctx, it); err != nil {
		s.failed.Add(1)
	}
	s.duration.Add(time.Since(t0))
}

// iterContext is cancelled GracefulStop after the executor's end, or with
// the parent.
func iterContext(parent context.Context, end time.Time, grace time.Duration) (context.Context, context.CancelFunc) {
	return context.WithDeadline(parent, end.Add(grace))
}

// sleepUntil waits until t or ctx is done; it reports whether t was reached.
func sleepUntil(ctx context.Context, t time.Time, timer *time.Timer) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		return false
	}
}

// ConstantVUs runs VUs virtual users, each looping over iterations back to
// back, for Duration (k6 constant-vus). Iterations, when positive, caps the
// total iterations started.
type ConstantVUs struct {
	VUs          int
	Duration     time.Duration
	Iterations   int64
	GracefulStop time.Duration // zero value means DefaultGracefulStop
}

func (e ConstantVUs) validate() error {
	if e.VUs < 1 || e.VUs > MaxExecutorVUs {
		return fmt.Errorf("constant-vus: VUs must be 1..%d", MaxExecutorVUs)
	}
	if e.Duration <= 0 || e.Duration > MaxExecutorDuration {
		return fmt.Errorf("constant-vus: duration must be in (0, %s]", MaxExecutorDuration)
	}
	return nil
}

// Run implements Executor.
func (e ConstantVUs) Run(ctx context.Context, reg *Registry, fn IterFunc) (Stats, error) {
	if err := e.validate(); err != nil {
		return Stats{}, err
	}
	s := newRunState(reg, fn)
	start := time.Now()
	end := start.Add(e.Duration)
	ictx, cancel := iterContext(ctx, end, gracefulOrDefault(e.GracefulStop))
	defer cancel()
	s.vus.Set(float64(e.VUs))
	var wg sync.WaitGroup
	for vu := range e.VUs {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				n := s.next.Add(1) - 1
				if e.Iterations > 0 && n >= e.Iterations {
					return
				}
				s.run(ictx, Iter{VU: vu, N: n, Scheduled: time.Now()})
			}
		})
	}
	wg.Wait()
	s.vus.Set(0)
	return Stats{Iterations: s.started.Load(), Failed: s.failed.Load()}, ctx.Err()
}

// Stage is one leg of a ramping-vus schedule: move linearly to Target VUs
// over Duration.
type Stage struct {
	Duration time.Duration
	Target   int
}

// RampingVUs varies the number of looping virtual users along Stages,
// starting from StartVUs (k6 ramping-vus). A VU above the current count
// finishes its running iteration and then waits.
//
// Kept though no scenario uses it yet: docs/loadtest.md documents it as one
// of the three executors and its tests pin the schedule.
type RampingVUs struct {
	StartVUs     int
	Stages       []Stage
	GracefulStop time.Duration // zero value means DefaultGracefulStop
}

func (e RampingVUs) validate() error {
	if len(e.Stages) == 0 {
		return errors.New("ramping-vus: at least one stage")
	}
	if e.StartVUs < 0 || e.PeakVUs() > MaxExecutorVUs {
		return fmt.Errorf("ramping-vus: VUs must be 0..%d", MaxExecutorVUs)
	}
	var total time.Duration
	for _, st := range e.Stages {
		if st.Duration < 0 || st.Target < 0 {
			return errors.New("ramping-vus: stage durations and targets must not be negative")
		}
		total += st.Duration
	}
	if total <= 0 || total > MaxExecutorDuration {
		return fmt.Errorf("ramping-vus: total duration must be in (0, %s]", MaxExecutorDuration)
	}
	return nil
}

// PeakVUs is the most VUs the stages ask for at once.
func (e RampingVUs) PeakVUs() int {
	m := e.StartVUs
	for _, st := range e.Stages {
		m = max(m, st.Target)
	}
	return m
}

// Duration is the sum of the stages.
func (e RampingVUs) Duration() time.Duration {
	var d time.Duration
	for _, st := range e.Stages {
		d += st.Duration
	}
	return d
}

// VUsAt is the number of active VUs at offset t from the start: linear
// within a stage, truncated towards the stage's starting count, the stage's
// target exactly at its end.
func (e RampingVUs) VUsAt(t time.Duration) int {
	from := e.StartVUs
	for _, st := range e.Stages {
		if t < st.Duration {
			step := int(int64(st.Target-from) * int64(t) / int64(st.Duration))
			return from + step
		}
		t -= st.Duration
		from = st.Target
	}
	return from
}

// rampChange is a point where the VU count changes.
type rampChange struct {
	at time.Duration
	n  int
}

// changes lists every offset at which VUsAt changes, in order.
func (e RampingVUs) changes() []rampChange {
	var out []rampChange
	from := e.StartVUs
	var off time.Duration
	for _, st := range e.Stages {
		if d := st.Target - from; d != 0 && st.Duration > 0 {
			step := 1
			if d < 0 {
				step, d = -1, -d
			}
			for k := 1; k <= d; k++ {
				// The first offset at which |Target-from|·t/D reaches k.
				at := time.Duration((int64(k)*int64(st.Duration) + int64(d) - 1) / int64(d))
				out = append(out, rampChange{off + at, from + step*k})
			}
		} else if d != 0 {
			out = append(out, rampChange{off, st.Target})
		}
		off += st.Duration
		from = st.Target
	}
	return out
}

// Run implements Executor.
func (e RampingVUs) Run(ctx context.Context, reg *Registry, fn IterFunc) (Stats, error) {
	if err := e.validate(); err != nil {
		return Stats{}, err
	}
	s := newRunState(reg, fn)
	start := time.Now()
	end := start.Add(e.Duration())
	ictx, cancel := iterContext(ctx, end, gracefulOrDefault(e.GracefulStop))
	defer cancel()

	var mu sync.Mutex // guards active, changed, over
	active, changed, over := e.StartVUs, make(chan struct{}), false
	state := func() (int, chan struct{}, bool) {
		mu.Lock()
		defer mu.Unlock()
		return active, changed, over
	}
	set := func(n int, done bool) {
		mu.Lock()
		active, over = n, done
		close(changed)
		changed = make(chan struct{})
		mu.Unlock()
		s.vus.Set(float64(n))
	}
	s.vus.Set(float64(e.StartVUs))

	var wg sync.WaitGroup
	for vu := range e.PeakVUs() {
		wg.Go(func() {
			for {
				n, ch, done := state()
				if done || ctx.Err() != nil {
					return
				}
				if vu < n {
					s.run(ictx, Iter{VU: vu, N: s.next.Add(1) - 1, Scheduled: time.Now()})
					continue
				}
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for _, c := range e.changes() {
		if !sleepUntil(ctx, start.Add(c.at), timer) {
			break
		}
		set(c.n, false)
	}
	sleepUntil(ctx, end, timer)
	set(0, true)
	wg.Wait()
	return Stats{Iterations: s.started.Load(), Failed: s.failed.Load()}, ctx.Err()
}

// ConstantArrivalRate starts Rate iterations per TimeUnit for Duration on a
// fixed schedule (k6 constant-arrival-rate): iteration i is due at
// start + i·TimeUnit/Rate whatever happened before, so exactly
// ceil(Duration·Rate/TimeUnit) iterations are scheduled. An iteration with
// no free VU gets a new one up to MaxVUs, else it is dropped and counted.
// A late scheduler catches up by starting every slot already due.
//
// A dropped iteration is a failure of the run, not a sample left out: its
// user waited for something that never happened. OnDrop lets the scenario
// count it where its iterations are judged: as failed, and in its latency
// from schedule as a sample slower than any measured one
// (Trend.AddDropped), so an overloaded run cannot report a better p99 than
// its users saw.
type ConstantArrivalRate struct {
	Rate            int           // 1..MaxArrivalRate
	TimeUnit        time.Duration // zero value means 1s; at most 1h
	Duration        time.Duration
	PreAllocatedVUs int           // VUs started up front; zero value means 1
	MaxVUs          int           // zero value means PreAllocatedVUs
	GracefulStop    time.Duration // zero value means DefaultGracefulStop
	// OnDrop, when set, is called with each dropped iteration (its N and
	// Scheduled; VU is -1) on the scheduling goroutine: it must not block.
	OnDrop func(Iter)
}

// MaxArrivalRate bounds ConstantArrivalRate.Rate (with the 2 h duration
// bound, the schedule's arithmetic stays inside int64).
const MaxArrivalRate = 1_000_000

func (e ConstantArrivalRate) unit() time.Duration {
	if e.TimeUnit <= 0 {
		return time.Second
	}
	return e.TimeUnit
}

func (e ConstantArrivalRate) preAllocated() int {
	if e.PreAllocatedVUs > 0 {
		return e.PreAllocatedVUs
	}
	return 1
}

// PeakVUs is the most VUs the executor starts: MaxVUs, at least the
// pre-allocated ones.
func (e ConstantArrivalRate) PeakVUs() int {
	return max(e.MaxVUs, e.preAllocated())
}

// Planned is the number of iterations the schedule holds.
func (e ConstantArrivalRate) Planned() int64 {
	// ceil(Duration·Rate/TimeUnit) in integers.
	num := int64(e.Duration) * int64(e.Rate)
	u := int64(e.unit())
	return (num + u - 1) / u
}

// Offset is when iteration i is due, relative to the start.
func (e ConstantArrivalRate) Offset(i int64) time.Duration {
	return time.Duration(i * int64(e.unit()) / int64(e.Rate))
}

func (e ConstantArrivalRate) validate() error {
	if e.Rate < 1 || e.Rate > MaxArrivalRate {
		return fmt.Errorf("constant-arrival-rate: rate must be 1..%d", MaxArrivalRate)
	}
	if e.TimeUnit > time.Hour {
		return errors.New("constant-arrival-rate: time unit must be at most 1h")
	}
	if e.Duration <= 0 || e.Duration > MaxExecutorDuration {
		return fmt.Errorf("constant-arrival-rate: duration must be in (0, %s]", MaxExecutorDuration)
	}
	if e.PeakVUs() > MaxExecutorVUs {
		return fmt.Errorf("constant-arrival-rate: at most %d VUs", MaxExecutorVUs)
	}
	return nil
}

// Run implements Executor.
func (e ConstantArrivalRate) Run(ctx context.Context, reg *Registry, fn IterFunc) (Stats, error) {
	if err := e.validate(); err != nil {
		return Stats{}, err
	}
	s := newRunState(reg, fn)
	dropped := s.reg.Counter(MetricDroppedIterations)
	start := time.Now()
	end := start.Add(e.Duration)
	ictx, cancel := iterContext(ctx, end, gracefulOrDefault(e.GracefulStop))
	defer cancel()

	work := make(chan Iter) // unbuffered: a send succeeds only to an idle VU
	var wg sync.WaitGroup
	vus := 0
	spawn := func(first *Iter) {
		id := vus
		vus++
		s.vus.Set(float64(vus))
		wg.Go(func() {
			if first != nil {
				it := *first
				it.VU = id
				s.run(ictx, it)
			}
			for it := range work {
				it.VU = id
				s.run(ictx, it)
			}
		})
	}
	for range e.preAllocated() {
		spawn(nil)
	}
	var nDropped int64
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	planned := e.Planned()
	for i := int64(0); i < planned; i++ {
		due := start.Add(e.Offset(i))
		if !sleepUntil(ctx, due, timer) {
			break
		}
		it := Iter{N: i, Scheduled: due}
		select {
		case work <- it:
		default:
			if vus < e.PeakVUs() {
				spawn(&it)
			} else {
				nDropped++
				dropped.Inc()
				if e.OnDrop != nil {
					it.VU = -1
					e.OnDrop(it)
				}
			}
		}
	}
	close(work)
	wg.Wait()
	s.vus.Set(0)
	return Stats{Iterations: s.started.Load(), Failed: s.failed.Load(), Dropped: nDropped}, ctx.Err()
}
