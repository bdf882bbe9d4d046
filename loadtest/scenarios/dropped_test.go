package scenarios

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// slowPublisher publishes every event after a pause, as a target that
// answers slowly holds the publishing VU: with one VU most of a 100/s
// schedule finds it busy and is dropped.
type slowPublisher struct {
	publisher
	pause time.Duration
}

func (p *slowPublisher) Publish(ctx context.Context, channel string, frame []byte) error {
	select {
	case <-time.After(p.pause):
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.publisher.Publish(ctx, channel, frame)
}

// thresholdByExpr finds a threshold's result in the summary.
func thresholdByExpr(t *testing.T, sum *loadtest.Summary, expr string) loadtest.ThresholdResult {
	t.Helper()
	for _, r := range sum.Thresholds {
		if r.Expr == expr {
			return r
		}
	}
	t.Fatalf("no threshold %q in %+v", expr, sum.Thresholds)
	return loadtest.ThresholdResult{}
}

// Events the generator dropped (its only VU busy) are deliveries their
// subscribers never got: they are failed publishes, and in delivery_latency
// they rank above every measured delivery, so a p99 from schedule cannot
// pass on the events that happened to run.
func TestBroadcastDroppedEventsFailTheLatencyAndPublishThresholds(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-rate", "100", "-publishers", "1",
		"-max-publishers", "1", "-drain", "5s")
	sc.(*Broadcast).faults = func(p publisher) publisher { return &slowPublisher{publisher: p, pause: 40 * time.Millisecond} }
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: time.Second,
		Thresholds: []string{"delivery_p99<30s", "publish_failed<1%", "delivery_lost==0"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	dropped := count(sum, loadtest.MetricDroppedIterations)
	if dropped == 0 {
		t.Fatal("no iteration was dropped: the test did not overload its publisher")
	}
	lat := sum.Snapshot.Metrics[loadtest.MetricDeliveryLatency]
	// 10 subscribers per dialog: each dropped event is 10 deliveries that
	// count in the trend.
	if want := count(sum, loadtest.MetricDeliveryReceived) + 10*dropped; lat.Count != want {
		t.Errorf("delivery_latency count %d, want %d received + %d for the %d dropped events",
			lat.Count, count(sum, loadtest.MetricDeliveryReceived), 10*dropped, dropped)
	}
	if p := thresholdByExpr(t, sum, "delivery_p99<30s"); p.OK || !math.IsInf(p.Observed, 1) {
		t.Errorf("delivery_p99<30s with %d of 100 events dropped: %+v, want failed at +Inf", dropped, p)
	}
	if p := thresholdByExpr(t, sum, "publish_failed<1%"); p.OK {
		t.Errorf("publish_failed<1%% with %d of 100 events dropped: %+v, want failed", dropped, p)
	}
	// What was published still arrived: the drops are not losses.
	if p := thresholdByExpr(t, sum, "delivery_lost==0"); !p.OK {
		t.Errorf("delivery_lost==0: %+v", p)
	}
}

// Sends the generator dropped (its only sender busy) are failed sends
// whose latency never ends: sends_failed counts them and send_latency
// ranks them above every answered send.
func TestSendSQLDroppedSendsFailTheLatencyThreshold(t *testing.T) {
	startGateway(t) // migrates the database
	sc := newScenario(t, "send-sql", "-database-url", env.DatabaseURL, "-users", "4", "-dialogs", "2",
		"-rate", "2000", "-senders", "1", "-max-senders", "1")
	sum := run(t, sc, loadtest.Options{Target: DefaultTarget, Duration: time.Second,
		Thresholds: []string{"send_latency_p99<30s"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	dropped := count(sum, loadtest.MetricDroppedIterations)
	if dropped == 0 {
		t.Fatal("no send was dropped: the test did not overload its sender")
	}
	lat := sum.Snapshot.Metrics[MetricSendLatency]
	if want := count(sum, MetricSendsOK) + dropped; lat.Count != want {
		t.Errorf("send_latency count %d, want sends_ok %d + %d dropped", lat.Count, count(sum, MetricSendsOK), dropped)
	}
	if got := count(sum, MetricSendsFailed); got < dropped {
		t.Errorf("sends_failed = %d, want at least the %d dropped sends", got, dropped)
	}
	if p := thresholdByExpr(t, sum, "send_latency_p99<30s"); p.OK || !math.IsInf(p.Observed, 1) {
		t.Errorf("send_latency_p99<30s with %d of 2000 sends dropped: %+v, want failed at +Inf", dropped, p)
	}
	sendsChecked(t, sum)
}
