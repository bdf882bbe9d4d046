package scenarios

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// wsOpenOn reads han_ws_connections, the open sockets the gateway at base
// counts itself.
func wsOpenOn(base string) (int, bool) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "han_ws_connections "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err == nil
		}
	}
	return 0, false
}

// perTarget checks that the per-target counts of metric over bases are
// each want and add up to the metric's total.
func perTarget(t *testing.T, sum *loadtest.Summary, metric string, bases []string, want int64) {
	t.Helper()
	var total int64
	for _, b := range bases {
		n := count(sum, loadtest.Tagged(metric, loadtest.MetricTargetTag, b))
		if want >= 0 && n != want {
			t.Errorf("%s at %s = %d, want %d", metric, b, n, want)
		}
		if n == 0 {
			t.Errorf("%s at %s = 0: the run did not reach it", metric, b)
		}
		total += n
	}
	if got := count(sum, metric); got != total {
		t.Errorf("%s = %d, but its per-target counts add up to %d", metric, got, total)
	}
}

// Idle connections over two gateways: each gateway holds half of them (as
// it counts them itself), the summary's per-target session counts say the
// same and add up to the total, and the cost per connection is the two
// gateways' together.
func TestIdleSpreadsConnectionsOverTwoGateways(t *testing.T) {
	a, b := startGateway(t), startGateway(t)
	const conns = 20
	sc := newScenario(t, "idle-connections", "-dev-secret", testDevSecret, "-conns", strconv.Itoa(conns), "-settle", "10ms")

	// Watch both gateways while the run holds its connections.
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		peak = map[string]int{}
	)
	for _, base := range []string{a, b} {
		wg.Go(func() {
			for ctx.Err() == nil {
				if n, ok := wsOpenOn(base); ok {
					mu.Lock()
					peak[base] = max(peak[base], n)
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	sum := run(t, sc, loadtest.Options{Target: a + "," + b, Duration: 2 * time.Second})
	cancel()
	wg.Wait()
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v %+v", sum.Err, sum.Thresholds, sum.Info)
	}
	for _, base := range []string{a, b} {
		if peak[base] != conns/2 {
			t.Errorf("gateway %s held at most %d sockets, want %d (half)", base, peak[base], conns/2)
		}
	}
	perTarget(t, sum, loadtest.MetricWSSessions, []string{a, b}, conns/2)
	if n := count(sum, loadtest.MetricErrors); n != 0 {
		t.Errorf("errors = %d", n)
	}
	if v := infoValue(sum, "target"); v != "gateways "+a+","+b {
		t.Errorf("target info = %q", v)
	}
	var text bytes.Buffer
	sum.WriteText(&text)
	for _, base := range []string{a, b} {
		if !strings.Contains(text.String(), "ws_sessions{target="+base+"}") {
			t.Errorf("the summary lacks the sessions of %s:\n%s", base, text.String())
		}
	}
}

// chat-fanout over two gateways: members of each dialog sit on both, each
// sender posts through the gateway its socket is on, and every accepted
// message reaches every member, so every message crossed from one gateway
// to the other. REST calls and sockets are counted per gateway and add up
// to the totals.
func TestChatFanoutSpreadsOverTwoGateways(t *testing.T) {
	a, b := startGateway(t), startGateway(t)
	sc := newScenario(t, "chat-fanout", "-dev-secret", testDevSecret, "-users", "10", "-dialogs", "2",
		"-rate", "10", "-drain", "10s")
	sum := run(t, sc, loadtest.Options{Target: a + "," + b, Duration: time.Second,
		Thresholds: []string{"delivery_lost==0", "delivery_duplicates==0"}})
	if sum.Err != nil || !sum.Passed() {
		t.Fatalf("run failed: %v %+v %+v", sum.Err, sum.Thresholds, sum.Info)
	}
	ok := count(sum, MetricSendsOK)
	if ok != 10 {
		t.Errorf("sends_ok = %d, want 10", ok)
	}
	// 5 members per dialog, on both gateways.
	if exp, got := count(sum, loadtest.MetricDeliveryExpected), count(sum, loadtest.MetricDeliveryReceived); exp != 5*ok || got != exp {
		t.Errorf("deliveries %d of %d, want %d", got, exp, 5*ok)
	}
	perTarget(t, sum, loadtest.MetricWSSessions, []string{a, b}, 5)
	perTarget(t, sum, loadtest.MetricHTTPReqs, []string{a, b}, -1)
	if n := count(sum, loadtest.MetricErrors); n != 0 {
		t.Errorf("errors = %d", n)
	}
	sendsChecked(t, sum)
}

// A list names gateways only, each once; scenarios that load one target
// refuse a list.
func TestTargetListsAreChecked(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"http://127.0.0.1:1,baseline-inprocess", "http://127.0.0.1:1,http://10.0.0.1:2",
		"http://127.0.0.1:1,,http://127.0.0.1:2", "http://127.0.0.1:1,http://127.0.0.1:1", "http://127.0.0.1:1,centrifugo:http://127.0.0.1:2"} {
		if tg, err := openTargets(ctx, bad); err == nil {
			tg.close()
			t.Errorf("target list %q accepted", bad)
		}
	}
	if _, err := openTarget(ctx, "http://127.0.0.1:1,http://127.0.0.1:2"); err == nil {
		t.Error("a one-target scenario accepted a list")
	}
	tg, err := openTargets(ctx, " http://127.0.0.1:1/ , http://localhost:2")
	if err != nil {
		t.Fatal(err)
	}
	if !tg.spread() || tg.baseOf(0) != "http://127.0.0.1:1" || tg.baseOf(1) != "http://localhost:2" || tg.baseOf(2) != "http://127.0.0.1:1" {
		t.Errorf("round-robin over %v: %s %s %s", tg.bases, tg.baseOf(0), tg.baseOf(1), tg.baseOf(2))
	}
	one, err := openTargets(ctx, "http://127.0.0.1:1")
	if err != nil || one.spread() || one.baseOf(7) != "http://127.0.0.1:1" {
		t.Errorf("one target: %v %v", one, err)
	}
}
