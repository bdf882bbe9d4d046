package loadtest_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// The executor tests run inside a synctest bubble: time is virtual, so the
// schedule's timing is asserted exactly and the tests take no wall time.

type record struct {
	vu        int
	n         int64
	scheduled time.Duration // offset of it.Scheduled from the start
	started   time.Duration // offset of the actual start
}

type recorder struct {
	mu    sync.Mutex
	start time.Time
	recs  []record
}

func (r *recorder) fn(work time.Duration) loadtest.IterFunc {
	return func(ctx context.Context, it loadtest.Iter) error {
		r.mu.Lock()
		r.recs = append(r.recs, record{it.VU, it.N, it.Scheduled.Sub(r.start), time.Since(r.start)})
		r.mu.Unlock()
		select {
		case <-time.After(work):
		case <-ctx.Done():
		}
		return nil
	}
}

func TestConstantArrivalRateSchedulesNIterationsInT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := loadtest.ConstantArrivalRate{Rate: 50, Duration: time.Second, PreAllocatedVUs: 2, MaxVUs: 4}
		if e.Planned() != 50 {
			t.Fatalf("planned = %d, want 50", e.Planned())
		}
		reg := loadtest.NewRegistry()
		r := &recorder{start: time.Now()}
		st, err := e.Run(context.Background(), reg, r.fn(30*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if st.Iterations != 50 || st.Dropped != 0 {
			t.Fatalf("stats = %+v, want 50 iterations, 0 dropped", st)
		}
		if got := reg.Counter(loadtest.MetricIterations).Value(); got != 50 {
			t.Fatalf("iterations metric = %d", got)
		}
		seen := map[int64]bool{}
		for _, rec := range r.recs {
			if want := time.Duration(rec.n) * 20 * time.Millisecond; rec.scheduled != want {
				t.Errorf("iteration %d scheduled at %v, want %v", rec.n, rec.scheduled, want)
			}
			if rec.started != rec.scheduled {
				t.Errorf("iteration %d started at %v, scheduled %v (a free VU must start it on time)", rec.n, rec.started, rec.scheduled)
			}
			seen[rec.n] = true
		}
		if len(seen) != 50 {
			t.Fatalf("distinct iterations = %d, want 50", len(seen))
		}
		// The last slot is at 980ms and takes 30ms.
		if el := time.Since(r.start); el != 1010*time.Millisecond {
			t.Fatalf("run took %v, want 1.01s", el)
		}
	})
}

func TestConstantArrivalRateDropsWhenEveryVUIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Slots every 100ms; each iteration takes 450ms; at most 2 VUs.
		// 0 → VU0, 100 → new VU1, 200..400 dropped, 500 → VU0 (free at 450),
		// 600 → VU1 (free at 550), 700..900 dropped.
		// OnDrop hears of each dropped slot when it is due, so a scenario
		// can count it as failed and as an unbounded latency.
		var (
			dropped []int64
			late    []time.Duration
		)
		e := loadtest.ConstantArrivalRate{Rate: 10, Duration: time.Second, PreAllocatedVUs: 1, MaxVUs: 2,
			OnDrop: func(it loadtest.Iter) {
				dropped = append(dropped, it.N)
				late = append(late, time.Since(it.Scheduled))
			}}
		reg := loadtest.NewRegistry()
		r := &recorder{start: time.Now()}
		st, err := e.Run(context.Background(), reg, r.fn(450*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if st.Iterations != 4 || st.Dropped != 6 {
			t.Fatalf("stats = %+v, want 4 iterations and 6 dropped", st)
		}
		if got := reg.Counter(loadtest.MetricDroppedIterations).Value(); got != 6 {
			t.Fatalf("dropped_iterations = %d, want 6", got)
		}
		if !slices.Equal(dropped, []int64{2, 3, 4, 7, 8, 9}) || !slices.Equal(late, make([]time.Duration, 6)) {
			t.Fatalf("OnDrop saw iterations %v, %v after their slots; want 2,3,4,7,8,9 each at its slot", dropped, late)
		}
		var ns []int64
		for _, rec := range r.recs {
			ns = append(ns, rec.n)
		}
		want := []int64{0, 1, 5, 6}
		if len(ns) != len(want) {
			t.Fatalf("iterations run = %v, want %v", ns, want)
		}
		for i := range want {
			if ns[i] != want[i] {
				t.Fatalf("iterations run = %v, want %v", ns, want)
			}
		}
	})
}

func TestConstantVUsLoopsForTheDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := loadtest.ConstantVUs{VUs: 3, Duration: time.Second}
		r := &recorder{start: time.Now()}
		st, err := e.Run(context.Background(), nil, r.fn(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		// Each VU starts iterations at 0, 100, …, 900ms.
		if st.Iterations != 30 {
			t.Fatalf("iterations = %d, want 30", st.Iterations)
		}
		perVU := map[int]int{}
		for _, rec := range r.recs {
			perVU[rec.vu]++
			if rec.started%(100*time.Millisecond) != 0 || rec.started >= time.Second {
				t.Errorf("iteration started at %v", rec.started)
			}
		}
		for vu := range 3 {
			if perVU[vu] != 10 {
				t.Errorf("VU %d ran %d iterations, want 10", vu, perVU[vu])
			}
		}
	})
}

func TestConstantVUsIterationCapAndGracefulStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := loadtest.ConstantVUs{VUs: 2, Duration: 10 * time.Second, Iterations: 7}
		st, err := e.Run(context.Background(), nil, (&recorder{start: time.Now()}).fn(time.Millisecond))
		if err != nil || st.Iterations != 7 {
			t.Fatalf("iterations = %d (%v), want the cap of 7", st.Iterations, err)
		}

		// An iteration that never ends on its own is cancelled GracefulStop
		// after the duration.
		start := time.Now()
		e = loadtest.ConstantVUs{VUs: 1, Duration: time.Second, GracefulStop: 500 * time.Millisecond}
		st, _ = e.Run(context.Background(), nil, func(ctx context.Context, _ loadtest.Iter) error {
			<-ctx.Done()
			return ctx.Err()
		})
		if el := time.Since(start); el != 1500*time.Millisecond {
			t.Fatalf("run took %v, want duration + graceful stop = 1.5s", el)
		}
		if st.Iterations != 1 || st.Failed != 1 {
			t.Fatalf("stats = %+v, want 1 iteration that failed", st)
		}
	})
}

func TestRampingVUsFollowsStages(t *testing.T) {
	e := loadtest.RampingVUs{Stages: []loadtest.Stage{
		{Duration: time.Second, Target: 4}, {Duration: time.Second, Target: 4}, {Duration: time.Second, Target: 0},
	}}
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{0, 0}, {249 * time.Millisecond, 0}, {250 * time.Millisecond, 1}, {999 * time.Millisecond, 3},
		{time.Second, 4}, {2 * time.Second, 4}, {2249 * time.Millisecond, 4}, {2250 * time.Millisecond, 3},
		{2999 * time.Millisecond, 1}, {3 * time.Second, 0}} {
		if got := e.VUsAt(c.at); got != c.want {
			t.Errorf("VUsAt(%v) = %d, want %d", c.at, got, c.want)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		reg := loadtest.NewRegistry()
		r := &recorder{start: time.Now()}
		st, err := e.Run(context.Background(), reg, r.fn(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		// VU k is active from 250·(k+1) ms until the ramp-down drops it
		// (3000, 2750, 2500, 2250 ms); it starts an iteration every 100ms
		// while active.
		wantFirst := []time.Duration{250, 500, 750, 1000}
		wantCount := []int{28, 23, 18, 13}
		first := map[int]time.Duration{}
		count := map[int]int{}
		for _, rec := range r.recs {
			if _, ok := first[rec.vu]; !ok {
				first[rec.vu] = rec.started
			}
			count[rec.vu]++
			if active := e.VUsAt(rec.started); rec.vu >= active {
				t.Errorf("VU %d started an iteration at %v while only %d VUs were active", rec.vu, rec.started, active)
			}
		}
		for vu := range 4 {
			if first[vu] != wantFirst[vu]*time.Millisecond || count[vu] != wantCount[vu] {
				t.Errorf("VU %d: first iteration at %v, %d iterations; want %v and %d",
					vu, first[vu], count[vu], wantFirst[vu]*time.Millisecond, wantCount[vu])
			}
		}
		if st.Iterations != 82 {
			t.Fatalf("iterations = %d, want 82", st.Iterations)
		}
		snap := reg.Snapshot().Metrics[loadtest.MetricVUs]
		if snap.Max != 4 || snap.Value != 0 {
			t.Fatalf("vus gauge max/last = %v/%v, want 4/0", snap.Max, snap.Value)
		}
	})
}

func TestExecutorsRefuseUnboundedOrInvalidPlans(t *testing.T) {
	ctx := context.Background()
	nop := func(context.Context, loadtest.Iter) error { return nil }
	for name, e := range map[string]loadtest.Executor{
		"no VUs":          loadtest.ConstantVUs{Duration: time.Second},
		"no duration":     loadtest.ConstantVUs{VUs: 1},
		"too long":        loadtest.ConstantVUs{VUs: 1, Duration: 3 * time.Hour},
		"no stages":       loadtest.RampingVUs{StartVUs: 1},
		"zero rate":       loadtest.ConstantArrivalRate{Duration: time.Second},
		"rate too high":   loadtest.ConstantArrivalRate{Rate: loadtest.MaxArrivalRate + 1, Duration: time.Second},
		"too many VUs":    loadtest.ConstantArrivalRate{Rate: 1, Duration: time.Second, MaxVUs: loadtest.MaxExecutorVUs + 1},
		"no ramp length":  loadtest.RampingVUs{Stages: []loadtest.Stage{{Target: 3}}},
		"negative target": loadtest.RampingVUs{Stages: []loadtest.Stage{{Duration: time.Second, Target: -1}}},
	} {
		if _, err := e.Run(ctx, nil, nop); err == nil {
			t.Errorf("%s: Run accepted an invalid plan", name)
		}
	}
}
