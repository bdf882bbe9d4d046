package scenarios

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// A publish the generator saw fail may still reach every subscriber (a
// timeout after the target took the event). Those deliveries are counted
// as unexpected, not as received instances of the accepted events, so
// they can never cover a loss; with nothing lost, delivery_lost stays 0.
func TestBroadcastDeliveriesOfFailedPublishesAreUnexpected(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-rate", "100", "-publishers", "2",
		"-drain", "10s", "-fault-fail-publish-every", "10")
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: time.Second})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	// 100 publishes, every tenth reported failed, 10 subscribers a dialog.
	failed := sum.Snapshot.Metrics[loadtest.MetricPublishFailed]
	if failed.Count != 100 || failed.Rate != 0.1 {
		t.Fatalf("publish_failed = %v of %d, want 0.1 of 100", failed.Rate, failed.Count)
	}
	for name, want := range map[string]int64{loadtest.MetricDeliveryExpected: 900, loadtest.MetricDeliveryLost: 0} {
		if got := count(sum, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	// The drain waits for the accepted events only, so the deliveries of
	// the last publish (the 100th, failed) may still be on their way when
	// the run is tallied. Those of the nine failed before it came ahead of
	// later accepted events on every connection.
	rcv, unexp := count(sum, loadtest.MetricDeliveryReceived), count(sum, loadtest.MetricDeliveryUnexpected)
	if unexp < 90 || unexp > 100 || rcv < 990 || rcv > 1000 {
		t.Errorf("delivery_received %d, delivery_unexpected %d: want 990..1000 and 90..100", rcv, unexp)
	}
}

// In step mode every step's deliveries are accounted on their own, but
// what the steps lost must reach the run's delivery_lost: a threshold
// delivery_lost==0 has to fail when a step lost deliveries.
func TestBroadcastStepLossReachesTheRunsThresholds(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "50,100",
		"-publishers", "2", "-drain", "500ms", "-fault-drop-every", "10")
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: time.Second,
		Thresholds: []string{"delivery_lost==0"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	if sum.ThresholdsPassed() || count(sum, loadtest.MetricDeliveryLost) == 0 {
		t.Errorf("every tenth delivery was dropped, yet delivery_lost = %d and the threshold passed: %+v",
			count(sum, loadtest.MetricDeliveryLost), sum.Thresholds)
	}
	if count(sum, loadtest.MetricDeliveryExpected) < 500 {
		t.Errorf("delivery_expected = %d: the step's publishes were not added", count(sum, loadtest.MetricDeliveryExpected))
	}
}

// A step holds only when it carried every event: one with failed
// publishes stops the climb, even though nothing was lost.
func TestBroadcastStepWithFailedPublishesDoesNotHold(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "50,100", "-step-p99", "30s",
		"-publishers", "2", "-drain", "5s", "-fault-fail-publish-every", "5")
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 500 * time.Millisecond,
		Thresholds: []string{"max_delivery_rate>0"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	steps := 0
	for _, in := range sum.Info {
		if strings.Contains(in.Key, "_step_") {
			steps++
			if v := in.Value.(string); !strings.Contains(v, "held false") || !strings.Contains(v, "publish failures 5") {
				t.Errorf("%s: %s, want 5 publish failures and held false", in.Key, v)
			}
		}
	}
	if steps != 1 || sum.ThresholdsPassed() {
		t.Errorf("steps measured %d (want 1), max_delivery_rate %v (want 0)", steps, sum.Snapshot.Metrics[MetricMaxDeliveryRate].Value)
	}
}

// warmupFaults skips the third publish (reported accepted, so every
// subscriber of its dialog loses it) and sends the seventh twice (every
// subscriber gets it twice); the others pass.
type warmupFaults struct {
	publisher
	n atomic.Int64
}

func (p *warmupFaults) Publish(ctx context.Context, channel string, frame []byte) error {
	switch p.n.Add(1) {
	case 3:
		return nil
	case 7:
		if err := p.publisher.Publish(ctx, channel, frame); err != nil {
			return err
		}
	}
	return p.publisher.Publish(ctx, channel, frame)
}

// The warm-up is unmeasured for speed, not for correctness: an event it
// lost or delivered twice must reach the run's delivery_lost and
// delivery_duplicates, and fail their thresholds, as a step's would, even
// when every step that follows carried everything.
func TestBroadcastWarmupLossAndDuplicatesReachTheRunsThresholds(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "50", "-step-p99", "30s",
		"-warmup", "1s", "-publishers", "2", "-drain", "500ms")
	sc.(*Broadcast).faults = func(p publisher) publisher { return &warmupFaults{publisher: p} }
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 500 * time.Millisecond,
		Thresholds: []string{"delivery_lost==0", "delivery_duplicates==0"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	// Both faults fall in the warm-up's 50 publishes; a dialog has 10
	// subscribers.
	lost, dups := count(sum, loadtest.MetricDeliveryLost), count(sum, loadtest.MetricDeliveryDuplicates)
	if lost != 10 || dups != 10 {
		t.Errorf("delivery_lost %d, delivery_duplicates %d: want 10 each (the warm-up's)", lost, dups)
	}
	if len(sum.Thresholds) != 2 {
		t.Fatalf("thresholds evaluated: %+v", sum.Thresholds)
	}
	for _, th := range sum.Thresholds {
		if th.OK {
			t.Errorf("threshold %s passed although the warm-up lost and doubled deliveries", th.Expr)
		}
	}
	if exp := count(sum, loadtest.MetricDeliveryExpected); exp != 750 {
		t.Errorf("delivery_expected = %d, want 750 (500 of the warm-up, 250 of the step)", exp)
	}
	var warm, step string
	for _, in := range sum.Info {
		switch in.Key {
		case "target_warmup":
			warm = in.Value.(string)
		case "target_step_50":
			step = in.Value.(string)
		}
	}
	if !strings.Contains(warm, "lost 10, duplicates 10") {
		t.Errorf("warm-up line %q: want its loss and duplicates", warm)
	}
	if !strings.Contains(step, "lost 0") || !strings.Contains(step, "held true") {
		t.Errorf("step line %q: the step itself carried everything", step)
	}
}

// A plan that puts more events into one dialog than one measurement can
// match to deliveries is refused up front, instead of running for hours
// and reporting a loss it could not count.
func TestBroadcastRefusesMoreEventsPerDialogThanItCanTrack(t *testing.T) {
	// Bounded by ctx: a plan that is not refused runs only until then.
	bounded := func(sc Scenario, dur time.Duration) *loadtest.Summary {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sum, err := loadtest.Run(ctx, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: dur})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	sum := bounded(newScenario(t, "broadcast", "-conns", "2", "-dialogs", "1", "-rate", "20000"), 2*time.Hour)
	if sum.Err == nil || !strings.Contains(sum.Err.Error(), "events into one of 1 dialogs") {
		t.Fatalf("run error = %v, want the plan refused", sum.Err)
	}
	if n := count(sum, loadtest.MetricWSSessions); n != 0 {
		t.Errorf("%d sessions opened for a refused plan", n)
	}
	sum = bounded(newScenario(t, "broadcast", "-conns", "2", "-dialogs", "1", "-step-rates", "10,20000"), time.Hour)
	if sum.Err == nil || !strings.Contains(sum.Err.Error(), "events into one of 1 dialogs") {
		t.Fatalf("step run error = %v, want the plan refused", sum.Err)
	}
}

// Every dialog of a shape has a subscriber, and a shape is bounded before
// anything is sized by it: -dialogs beyond the connections' subscriptions
// (publishing into dialogs nobody hears, or allocating per dialog for a
// huge value) is a usage error, before any connection.
func TestBroadcastRefusesDialogsWithoutSubscribers(t *testing.T) {
	for _, args := range [][]string{
		{"-conns", "2", "-dialogs", "100000"},
		{"-conns", "2", "-dialogs", "3", "-subs-per-conn", "1"},
		{"-conns", "2000000", "-dialogs", "1"},
		{"-conns", "20000", "-dialogs", "1000", "-subs-per-conn", "1000"},
	} {
		sc := newScenario(t, "broadcast", append(args, "-rate", "1")...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sum, err := loadtest.Run(ctx, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 100 * time.Millisecond})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if sum.Err == nil || count(sum, loadtest.MetricWSSessions) != 0 {
			t.Errorf("%v: run error %v after %d sessions, want the shape refused before connecting", args, sum.Err, count(sum, loadtest.MetricWSSessions))
		}
	}
}

// lateFaults holds the third publish back (reported accepted, so the
// warm-up loses it) and sends it just before the 26th, the first of the
// step that follows a 25-publish warm-up.
type lateFaults struct {
	publisher
	n    atomic.Int64
	mu   sync.Mutex
	held []byte
	ch   string
}

func (p *lateFaults) Publish(ctx context.Context, channel string, frame []byte) error {
	switch p.n.Add(1) {
	case 3:
		p.mu.Lock()
		p.held, p.ch = append([]byte(nil), frame...), channel
		p.mu.Unlock()
		return nil
	case 26:
		p.mu.Lock()
		held, ch := p.held, p.ch
		p.mu.Unlock()
		if err := p.publisher.Publish(ctx, ch, held); err != nil {
			return err
		}
	}
	return p.publisher.Publish(ctx, channel, frame)
}

// An event one measurement lost that arrives during the next one stays
// lost: the next measurement neither counts it as received (the run's
// totals would then hold it as lost and received at once) nor as a
// delivery nobody expected.
func TestBroadcastLateEventOfAnEarlierMeasurementStaysLost(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "50", "-step-p99", "30s",
		"-warmup", "500ms", "-publishers", "2", "-drain", "300ms")
	sc.(*Broadcast).faults = func(p publisher) publisher { return &lateFaults{publisher: p} }
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 500 * time.Millisecond})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	exp, got, lost := count(sum, loadtest.MetricDeliveryExpected), count(sum, loadtest.MetricDeliveryReceived), count(sum, loadtest.MetricDeliveryLost)
	// 25 publishes in the warm-up and 25 in the step, 10 subscribers each.
	if exp != 500 || lost != 10 || got != exp-lost {
		t.Errorf("expected %d, received %d, lost %d: want 500, 490, 10 (dropped iterations %d)", exp, got, lost, count(sum, loadtest.MetricDroppedIterations))
	}
	if n := count(sum, loadtest.MetricDeliveryUnexpected); n != 0 {
		t.Errorf("delivery_unexpected = %d, want 0", n)
	}
}

// A -cpu-pid that names no running process is refused before the run,
// instead of leaving its CPU figure out of every measurement silently.
func TestBroadcastRefusesACPUPIDThatIsNotRunning(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := strconv.Itoa(cmd.ProcessState.Pid())
	sc := newScenario(t, "broadcast", "-conns", "2", "-dialogs", "1", "-rate", "10", "-cpu-pid", "server="+gone)
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 200 * time.Millisecond})
	var usage *loadtest.UsageError
	if !errors.As(sum.Err, &usage) || !strings.Contains(sum.Err.Error(), "server="+gone) {
		t.Fatalf("run error = %v, want the exited -cpu-pid refused as a usage error", sum.Err)
	}
	sc = newScenario(t, "broadcast", "-conns", "2", "-dialogs", "1", "-rate", "10", "-drain", "5s", "-cpu-pid", "self="+strconv.Itoa(os.Getpid()))
	sum = run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 200 * time.Millisecond})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	found := false
	for _, in := range sum.Info {
		found = found || in.Key == "target_cpu_s_per_1m_self"
	}
	if !found {
		t.Errorf("no CPU figure for a running -cpu-pid: %+v", sum.Info)
	}
}
