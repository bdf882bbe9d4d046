package scenarios

import (
	"strings"
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
