package scenarios

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/loadtest"
)

const testDevSecret = "scenarios-test-dev-secret-0123456789abcdef"

var (
	buildOnce sync.Once
	gwBin     string
	buildErr  error
)

// startGateway builds cmd/han-gateway once and runs it on the package's
// private Redis and PostgreSQL with the built-in rate-limit policies; it
// returns the base URL. The process is stopped when the test ends.
func startGateway(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "han-scenarios-bin-")
		if err != nil {
			buildErr = err
			return
		}
		gwBin = filepath.Join(dir, "han-gateway")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		out, err := exec.Command(goTool, "build", "-o", gwBin, "github.com/han-app/gateway/cmd/han-gateway").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build han-gateway: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(gwBin)
	cmd.Env = append(os.Environ(), "HAN_HTTP_ADDR="+addr, "DATABASE_URL="+env.DatabaseURL,
		"REDIS_URL="+env.Redis.URL(0), "REDIS_REALTIME_URL="+env.Redis.URL(1),
		"HAN_JWT_DEV_HS256_SECRET="+testDevSecret, "HAN_HMAC_SECRET=scenarios-hmac-0123456789",
		"HAN_DRAIN_DELAY=0", "HAN_LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-done:
			t.Fatal("han-gateway exited before it was ready")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("han-gateway not ready within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logDeliveryCounters logs the gateway's counters that explain a lost or
// duplicated delivery: the outbox relay's publishes (a row published again
// after its grace), lost delivered marks, the Pub/Sub link's reconnects and
// the resyncs and closes of the sockets.
func logDeliveryCounters(t *testing.T, base string) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Logf("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range []string{"han_outbox_", "han_pubsub_reconnects", "han_pubsub_link_up", "han_ws_resyncs", "han_ws_closes", "han_ws_queue_overflows", "han_ws_recover"} {
			if strings.HasPrefix(line, p) {
				t.Log(line)
			}
		}
	}
}

func infoValue(sum *loadtest.Summary, key string) string {
	for _, in := range sum.Info {
		if in.Key == key {
			return fmt.Sprint(in.Value)
		}
	}
	return ""
}

// sendsChecked asserts the history check found every accepted send once and
// in order.
func sendsChecked(t *testing.T, sum *loadtest.Summary) {
	t.Helper()
	for _, m := range []string{MetricHistoryMissing, MetricHistoryDuplicates, MetricHistoryReordered} {
		if n := count(sum, m); n != 0 {
			t.Errorf("%s = %d, want 0", m, n)
		}
	}
}

// -send-only connects no socket and still checks the history; rising steps
// that all hold set max_send_rate to the highest.
func TestChatFanoutSendOnlySteps(t *testing.T) {
	base := startGateway(t)
	sc := newScenario(t, "chat-fanout", "-dev-secret", testDevSecret, "-users", "20", "-dialogs", "4", "-send-only",
		"-step-rates", "4,8", "-step-p99", "30s")
	sum := run(t, sc, loadtest.Options{Target: base, Duration: time.Second, Thresholds: []string{"max_send_rate>0"}})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v %+v", sum.Err, sum.Thresholds, sum.Info)
	}
	if n := count(sum, loadtest.MetricWSSessions); n != 0 {
		t.Errorf("-send-only opened %d sockets", n)
	}
	if got := count(sum, MetricSendsOK); got != 12 {
		t.Errorf("sends_ok = %d, want 4 + 8", got)
	}
	if it, dr := count(sum, loadtest.MetricIterations), count(sum, loadtest.MetricDroppedIterations); it != 12 || dr != 0 {
		t.Errorf("iterations/dropped = %d/%d over the steps, want 12/0", it, dr)
	}
	if v := sum.Snapshot.Metrics[MetricMaxSendRate].Value; v != 8 {
		t.Errorf("max_send_rate = %v, want 8 (both steps held): %+v", v, sum.Info)
	}
	for _, k := range []string{"step_4", "step_8"} {
		if v := infoValue(sum, k); !strings.Contains(v, "held true") || !strings.Contains(v, "errors none") {
			t.Errorf("%s: %q", k, v)
		}
	}
	sendsChecked(t, sum)
}

// A hot dialog past the per-dialog send limit (60 per 10 s) gets 429s: the
// step does not hold, and max_send_rate stays at the step before it. The
// messages the limiter admitted are all in the history, in order, and
// every member's socket got them.
func TestChatFanoutHotDialogStepWith429sDoesNotHold(t *testing.T) {
	base := startGateway(t)
	sc := newScenario(t, "chat-fanout", "-dev-secret", testDevSecret, "-users", "10", "-hot-dialog",
		"-step-rates", "10,100,200", "-step-p99", "30s", "-drain", "10s")
	sum := run(t, sc, loadtest.Options{Target: base, Duration: time.Second,
		Thresholds: []string{"delivery_lost==0", "delivery_duplicates==0"}})
	if sum.Err != nil || !sum.Passed() {
		logDeliveryCounters(t, base)
		t.Fatalf("run failed: %v %+v %+v", sum.Err, sum.Thresholds, sum.Info)
	}
	if v := infoValue(sum, "step_10"); !strings.Contains(v, "held true") {
		t.Errorf("step_10: %q", v)
	}
	if v := infoValue(sum, "step_100"); !strings.Contains(v, "held false") || !strings.Contains(v, "429:") {
		t.Errorf("step_100 should fail on 429s: %q", v)
	}
	if v := infoValue(sum, "step_200"); v != "" {
		t.Errorf("a step ran after one that did not hold: %q", v)
	}
	if v := sum.Snapshot.Metrics[MetricMaxSendRate].Value; v != 10 {
		t.Errorf("max_send_rate = %v, want 10", v)
	}
	ok := count(sum, MetricSendsOK)
	if ok < 10 || ok > 60 || count(sum, MetricSendsFailed) == 0 {
		t.Errorf("sends ok/failed = %d/%d: want at most the 60 the dialog limit admits, and refusals", ok, count(sum, MetricSendsFailed))
	}
	// 10 members receive each accepted message.
	if exp := count(sum, loadtest.MetricDeliveryExpected); exp != 10*ok {
		t.Errorf("delivery_expected = %d, want %d", exp, 10*ok)
	}
	sendsChecked(t, sum)
}

// send-sql runs the store's send on a pool like the gateway's: every
// accepted send leaves its message, outbox row (delivered) and idempotency
// record, and the history check holds.
func TestSendSQLWritesWhatTheGatewayWrites(t *testing.T) {
	startGateway(t) // migrates the database
	sc := newScenario(t, "send-sql", "-database-url", env.DatabaseURL, "-users", "12", "-hot-dialog",
		"-step-rates", "20,40", "-step-p99", "30s")
	sum := run(t, sc, loadtest.Options{Target: DefaultTarget, Duration: time.Second, Thresholds: []string{"max_send_rate==40"}})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v %+v", sum.Err, sum.Thresholds, sum.Info)
	}
	if got := count(sum, MetricSendsOK); got != 60 {
		t.Fatalf("sends_ok = %d, want 20 + 40", got)
	}
	sendsChecked(t, sum)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var msgs, pending, idem int64
	if err := c.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM messages m JOIN dialogs d ON d.id = m.dialog_id WHERE d.title = 'loadtest' AND m.body LIKE '%x'),
		(SELECT count(*) FROM outbox WHERE delivered_at IS NULL),
		(SELECT count(*) FROM idempotency_records WHERE scope = 'msg_send')`).Scan(&msgs, &pending, &idem); err != nil {
		t.Fatal(err)
	}
	if msgs < 60 || pending != 0 || idem < 60 {
		t.Errorf("messages %d, undelivered outbox rows %d, idempotency records %d: want ≥ 60, 0, ≥ 60", msgs, pending, idem)
	}
	if sc := newScenario(t, "send-sql", "-database-url", "postgres://u@10.0.0.1:5432/db"); true {
		if sum := run(t, sc, loadtest.Options{Target: DefaultTarget, Duration: time.Second}); sum.Err == nil {
			t.Error("a remote PostgreSQL accepted")
		}
	}
}

// -database-url must be loopback or a Unix socket, every host of it: pgx
// falls back to the further hosts of a multi-host URL.
func TestDatabaseURLEveryHostMustBeLoopback(t *testing.T) {
	for _, ok := range []string{"postgres://u:p@127.0.0.1:5432/db", "postgres://u:p@127.0.0.1:5432,[::1]:5433/db",
		"postgres://u@localhost/db?host=/var/run/postgresql"} {
		if err := checkLoopbackDB(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"postgres://u:p@127.0.0.1:5432,10.1.2.3:5432/db", "postgres://u:p@10.1.2.3:5432,127.0.0.1:5432/db",
		"host=127.0.0.1,db.example.com user=u dbname=db"} {
		if err := checkLoopbackDB(bad); !errors.Is(err, loadtest.ErrNotLoopback) {
			t.Errorf("%s: %v, want ErrNotLoopback", bad, err)
		}
	}
}

// The history check names each way a history can disagree with the
// accepted sends.
func TestCheckHistory(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	acc := []sent{
		{id: "a", seq: 1, marker: 11, start: at(0), done: at(5)},
		{id: "b", seq: 2, marker: 12, start: at(10), done: at(15)},
		{id: "c", seq: 3, marker: 13, start: at(20), done: at(25)},
	}
	good := []stored{{"a", 1, 11}, {"b", 2, 12}, {"c", 3, 13}}
	if c := checkHistory(good, acc); c != (historyCheck{}) {
		t.Fatalf("clean history: %+v", c)
	}
	if c := checkHistory([]stored{{"a", 1, 11}, {"c", 3, 13}}, acc); c.missing != 1 {
		t.Errorf("lost b: %+v", c)
	}
	if c := checkHistory([]stored{{"a", 1, 11}, {"b", 2, 12}, {"b2", 3, 12}, {"c", 4, 13}}, acc); c.duplicates != 1 {
		t.Errorf("b stored twice: %+v", c)
	}
	// c was answered with seq 3 but is stored at 2.
	if c := checkHistory([]stored{{"a", 1, 11}, {"c", 2, 13}, {"b", 3, 12}}, acc); c.reordered == 0 {
		t.Errorf("swapped b/c: %+v", c)
	}
	// a was answered before b started, yet b got the lower seq.
	inv := []sent{{id: "a", seq: 2, start: at(0), done: at(5)}, {id: "b", seq: 1, start: at(10), done: at(15)}}
	if n := causalInversions(inv); n != 1 {
		t.Errorf("causal inversions = %d, want 1", n)
	}
}

// The history check judges accepted sends: with none (every send refused)
// or with -reconcile=false nothing was checked, and history_missing==0
// must fail as "no data" instead of passing on silence. With accepted
// sends a clean history reads 0.
func TestHistoryThresholdsNeedAcceptedSends(t *testing.T) {
	read := func(ctx context.Context, d int, after int64) ([]stored, bool, error) {
		if d == 0 && after == 0 {
			return []stored{{"a", 1, 11}}, false, nil
		}
		return nil, false, nil
	}
	judge := func(reconcile bool, accepted ...sent) loadtest.ThresholdResult {
		t.Helper()
		reg := loadtest.NewRegistry()
		declareSendMetrics(reg)
		f := &sendFlags{users: 4, dialogs: 2, dialogsPerUser: 1, concurrency: 1, reconcile: reconcile}
		r := newSendRun(f, nil, nil)
		r.accepted[0] = accepted
		if err := r.reconcile(context.Background(), &loadtest.T{Reg: reg}, read); err != nil {
			t.Fatal(err)
		}
		th, err := loadtest.ParseThreshold("history_missing==0")
		if err != nil {
			t.Fatal(err)
		}
		if err := th.Bind(reg); err != nil {
			t.Fatal(err)
		}
		return th.Evaluate(reg.Snapshot())
	}
	if r := judge(true); r.OK || !r.NoData {
		t.Errorf("no accepted send: %+v, want failed as no data", r)
	}
	if r := judge(false, sent{id: "a", seq: 1, marker: 11}); r.OK || !r.NoData {
		t.Errorf("-reconcile=false: %+v, want failed as no data", r)
	}
	if r := judge(true, sent{id: "a", seq: 1, marker: 11}); !r.OK {
		t.Errorf("one accepted send found in the history: %+v, want ok", r)
	}
}
