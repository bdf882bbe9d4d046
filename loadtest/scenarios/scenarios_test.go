package scenarios

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Postgres: true, Redis: true}, &env)
}

// newScenario builds a scenario with its flags parsed from args.
func newScenario(t *testing.T, name string, args ...string) Scenario {
	t.Helper()
	sc, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	sc.Flags(fs, func(string) string { return "" })
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return sc
}

func run(t *testing.T, sc Scenario, opts loadtest.Options) *loadtest.Summary {
	t.Helper()
	sum, err := loadtest.Run(context.Background(), sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func count(sum *loadtest.Summary, name string) int64 { return sum.Snapshot.Metrics[name].Count }

func TestBroadcastAgainstInProcessBaselineLosesNothing(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "50", "-dialogs", "5", "-rate", "100", "-publishers", "4", "-drain", "20s")
	var progress bytes.Buffer
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 2 * time.Second,
		Thresholds: []string{"delivery_lost==0", "delivery_p99<30s", "ws_connect_p95<30s"},
		Progress:   &progress, ProgressInterval: 300 * time.Millisecond})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v", sum.Err, sum.Thresholds)
	}
	// 100 events/s for 2s on 5 dialogs of 10 subscribers each.
	if got := count(sum, loadtest.MetricIterations); got != 200 {
		t.Fatalf("publishes = %d, want exactly 200", got)
	}
	for name, want := range map[string]int64{
		loadtest.MetricDeliveryExpected: 2000, loadtest.MetricDeliveryReceived: 2000, loadtest.MetricDeliveryLost: 0,
		loadtest.MetricDeliveryDuplicates: 0, loadtest.MetricDeliveryUnexpected: 0, loadtest.MetricDeliveryLatency: 2000,
		loadtest.MetricWSSessions: 50, loadtest.MetricWSConnecting: 50, loadtest.MetricWSClosed: 0,
	} {
		if got := count(sum, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if r := sum.Snapshot.Metrics[loadtest.MetricDeliveryRate].Value; r <= 0 {
		t.Errorf("delivery_rate = %v", r)
	}
	// The live progress line names the phase and the deliveries so far.
	if p := progress.String(); !strings.Contains(p, "target: publishing") || !strings.Contains(p, "delivered ") || !strings.Contains(p, "ws 50 open") {
		t.Errorf("progress output:\n%s", p)
	}
}

// A baseline that drops every 10th delivery is caught exactly.
func TestBroadcastCountsEveryLostDelivery(t *testing.T) {
	BaselineConfig.DropEvery = 10
	defer func() { BaselineConfig.DropEvery = 0 }()
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-rate", "50", "-drain", "2s")
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: time.Second,
		Thresholds: []string{"delivery_lost==0", "delivery_loss<1%"}})
	if sum.Err != nil {
		t.Fatal(sum.Err)
	}
	// 50 events × 10 subscribers = 500 deliveries, every 10th dropped.
	if exp, lost := count(sum, loadtest.MetricDeliveryExpected), count(sum, loadtest.MetricDeliveryLost); exp != 500 || lost != 50 {
		t.Fatalf("expected/lost = %d/%d, want 500/50", exp, lost)
	}
	if sum.Passed() {
		t.Fatal("thresholds passed while 10% of deliveries were lost")
	}
}

func TestIdleReportsServerCostPerConnection(t *testing.T) {
	sc := newScenario(t, "idle-connections", "-conns", "40", "-settle", "10ms")
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 200 * time.Millisecond,
		Thresholds: []string{"server_mem_per_conn>0B", "server_goroutines_per_conn>=2"}})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v", sum.Err, sum.Thresholds)
	}
	// In-process: the baseline's reader and writer plus the client's reader.
	if g := sum.Snapshot.Metrics[MetricServerGoroutinesPerConn].Value; g != 3 {
		t.Errorf("goroutines per connection = %v, want 3 in-process", g)
	}
}

func TestTargetsAndGatewaySettingsAreChecked(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"http://10.0.0.1:8080", "baseline:http://192.168.0.1:9090", "ftp://127.0.0.1/", "https://example.com",
		"centrifugo:http://10.0.0.1:8000", "centrifugo:ws://127.0.0.1:8000"} {
		if tg, err := openTarget(ctx, bad); err == nil {
			tg.close()
			t.Errorf("target %q accepted", bad)
		}
	}
	if _, err := newRedisPublisher(ctx, "redis://u:p@10.0.0.1:6379/1", rds.PubSubAuto, 1); err == nil {
		t.Error("a remote Redis accepted")
	}
	if _, err := newRedisPublisher(ctx, "", rds.PubSubAuto, 1); err == nil {
		t.Error("an empty Redis URL accepted")
	}
	// The gateway needs the dev secret to mint tokens; nothing is dialled.
	sc := newScenario(t, "broadcast", "-conns", "4", "-dialogs", "2")
	sum := run(t, sc, loadtest.Options{Target: "http://127.0.0.1:1", Duration: time.Second})
	if sum.Err == nil || !strings.Contains(sum.Err.Error(), "dev-secret") {
		t.Fatalf("err = %v, want the missing dev secret named", sum.Err)
	}
	// The publisher's Pub/Sub mode and the extra instances are checked
	// before anything is dialled.
	for flag, value := range map[string]string{"-pubsub-mode": "spublish"} {
		sc := newScenario(t, "broadcast", "-conns", "4", "-dialogs", "2", "-dev-secret", strings.Repeat("s", 32), flag, value)
		sum := run(t, sc, loadtest.Options{Target: "http://127.0.0.1:1", Duration: time.Second})
		if sum.Err == nil || !strings.Contains(sum.Err.Error(), flag+":") {
			t.Errorf("%s %s: err = %v, want the flag named", flag, value, sum.Err)
		}
	}
	for _, name := range []string{"chat-fanout", "connect-storm", "rate-limit", "project-queue"} {
		sum := run(t, newScenario(t, name), loadtest.Options{Target: TargetBaselineInProcess, Duration: time.Second})
		if sum.Err == nil {
			t.Errorf("%s ran against the baseline", name)
		}
		if name == "project-queue" { // refused for its missing flags before the target is looked at
			continue
		}
		sum = run(t, newScenario(t, name), loadtest.Options{Target: CentrifugoURLPrefix + "http://127.0.0.1:1", Duration: time.Second})
		if sum.Err == nil || !strings.Contains(sum.Err.Error(), "must be a gateway URL") {
			t.Errorf("%s against Centrifugo: err = %v, want the target refused", name, sum.Err)
		}
	}
}

// A Centrifugo target needs its HMAC secret (to mint connection tokens) and
// the Redis of its engine; the publisher's channels are Centrifugo's.
func TestCentrifugoTargetSettings(t *testing.T) {
	ctx := context.Background()
	tg, err := openTarget(ctx, CentrifugoURLPrefix+"http://127.0.0.1:8000")
	if err != nil || !tg.centrifugo || tg.gateway || tg.base != "http://127.0.0.1:8000" {
		t.Fatalf("openTarget: %+v, %v", tg, err)
	}
	tg.close()
	for _, name := range []string{"broadcast", "idle-connections"} {
		sum := run(t, newScenario(t, name, "-conns", "4", "-dialogs", "2"),
			loadtest.Options{Target: CentrifugoURLPrefix + "http://127.0.0.1:1", Duration: time.Second})
		if sum.Err == nil || !strings.Contains(sum.Err.Error(), "centrifugo-secret") {
			t.Errorf("%s: err = %v, want the missing Centrifugo secret named", name, sum.Err)
		}
	}
	env := map[string]string{
		envCentrifugoSecret:   strings.Repeat("s", 32),
		envCentrifugoRedisURL: "redis://127.0.0.1:6390",
	}
	var g gatewayFlags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	g.register(fs, func(k string) string { return env[k] }, true)
	g.registerCentrifugo(fs)
	if err := g.checkCentrifugo(); err != nil {
		t.Fatal(err)
	}
	if g.cfSecret != env[envCentrifugoSecret] || g.redisURL != env[envCentrifugoRedisURL] || g.cfPrefix != loadtest.CentrifugoRedisPrefix {
		t.Fatalf("settings from the environment: %+v", g)
	}
}

func TestShapes(t *testing.T) {
	s := shape{conns: 5000, dialogs: 500, subsPerConn: 1}
	for d, n := range s.subscribers() {
		if n != 10 {
			t.Fatalf("dialog %d has %d subscribers, want 10", d, n)
		}
	}
	if err := s.validate(true); err != nil {
		t.Fatal(err)
	}
	s = shape{conns: 10, dialogs: 4, subsPerConn: 2}
	total := 0
	for c := range s.conns {
		ds := s.dialogsOf(c)
		if len(ds) != 2 || ds[0] == ds[1] {
			t.Fatalf("connection %d subscribes %v", c, ds)
		}
		total += len(ds)
	}
	if total != 20 {
		t.Fatal(total)
	}
	for _, bad := range []shape{{10, 10, 1} /* 1 member per dialog */, {1000, 5, 1} /* 200 members */, {4, 2, 3}} {
		if err := bad.validate(true); err == nil {
			t.Errorf("%+v accepted for the gateway", bad)
		}
	}
}

func TestRegistry(t *testing.T) {
	if _, err := New("nope"); err == nil {
		t.Fatal("unknown scenario accepted")
	}
	for _, n := range Names() {
		sc := newScenario(t, n)
		if sc.Name() != n || sc.Describe() == "" {
			t.Errorf("%s: name %q", n, sc.Name())
		}
	}
	// Unknown metrics in thresholds are refused before anything runs.
	if _, err := loadtest.Run(context.Background(), newScenario(t, "broadcast"), loadtest.Options{
		Target: TargetBaselineInProcess, Thresholds: []string{"nosuch_p99<1ms"}}); err == nil {
		t.Fatal("unknown threshold metric accepted")
	}
}

// -step-rates measures rising rates on the same connections and keeps the
// highest that held p99 and lost nothing; -compare runs the same against a
// baseline first and reports the ratio.
func TestBroadcastStepsAndCompare(t *testing.T) {
	sc := newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "20,40", "-step-p99", "30s",
		"-drain", "2s", "-compare", TargetBaselineInProcess)
	sum := run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 500 * time.Millisecond,
		Thresholds: []string{"max_delivery_rate>0", "baseline_ratio>0"}})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v", sum.Err, sum.Thresholds)
	}
	held := 0
	for _, in := range sum.Info {
		if strings.Contains(in.Key, "_step_") && strings.Contains(in.Value.(string), "held true") {
			held++
		}
	}
	if held != 4 {
		t.Fatalf("steps that held = %d, want 2 per phase: %+v", held, sum.Info)
	}
	// The best step is the last one that held: the 40 events/s step.
	var step2 float64
	for _, in := range sum.Info {
		if in.Key == "target_step_40" {
			fmt.Sscanf(in.Value.(string), "%g", &step2)
		}
	}
	if got := sum.Snapshot.Metrics[MetricMaxDeliveryRate].Value; step2 == 0 || math.Round(got) != step2 {
		t.Errorf("max_delivery_rate = %v, want the 40/s step's %v", got, step2)
	}

	// A p99 no step can hold: nothing qualifies.
	sc = newScenario(t, "broadcast", "-conns", "20", "-dialogs", "2", "-step-rates", "20,40", "-step-p99", "1ns")
	sum = run(t, sc, loadtest.Options{Target: TargetBaselineInProcess, Duration: 300 * time.Millisecond,
		Thresholds: []string{"max_delivery_rate>0"}})
	if sum.Err != nil || sum.Passed() || sum.Snapshot.Metrics[MetricMaxDeliveryRate].Value != 0 {
		t.Fatalf("err %v, max_delivery_rate %v: want 0 and a failed threshold", sum.Err, sum.Snapshot.Metrics[MetricMaxDeliveryRate].Value)
	}
}
