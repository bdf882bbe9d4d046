package scenarios

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/loadtest"
)

// hungBaseline is a baseline-like target that answers hello and one
// subscribe on every connection, accepts publish sockets, and then stops
// answering: it reads nothing more and never answers a close handshake,
// like a hung process. Closing hang releases its handlers.
func hungBaseline(t *testing.T) *httptest.Server {
	hang := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc(loadtest.RealtimePath, func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{loadtest.Subprotocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"hello","connectionId":"1","instance":"hung"}`))
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		var f loadtest.Frame
		_ = loadtest.ParseFrame(b, &f)
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribed","dialogId":"`+f.DialogID+`","lastSeq":0}`))
		<-hang
	})
	mux.HandleFunc("/publish", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		<-hang
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		close(hang)
		srv.Close()
	})
	return srv
}

// -max-duration bounds the whole run, teardown included: against a target
// that stopped answering, the close handshakes (each waiting up to 5 s,
// -connect-concurrency at a time) must not carry the run past it.
func TestMaxDurationBoundsTheTeardownOfAHungTarget(t *testing.T) {
	srv := hungBaseline(t)
	sc := newScenario(t, "broadcast", "-conns", "4", "-dialogs", "2", "-rate", "20", "-publishers", "1",
		"-publisher-conns", "2", "-connect-concurrency", "1", "-drain", "100ms")
	bound := 2 * time.Second
	t0 := time.Now()
	sum := run(t, sc, loadtest.Options{Target: "baseline:" + srv.URL, Duration: 300 * time.Millisecond,
		MaxDuration: bound, SourceRange: "none"})
	took := time.Since(t0)
	t.Logf("run took %s with -max-duration %s (err %v)", took.Round(time.Millisecond), bound, sum.Err)
	if took > bound+2*time.Second {
		t.Errorf("the run took %s, far past its -max-duration %s", took.Round(time.Second), bound)
	}
}

// stallingListener accepts TCP connections and never reads or writes on
// them: a target that took the connection and then hung before answering
// anything, the handshake included. Connections are closed when the test
// ends.
func stallingListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return "http://" + l.Addr().String()
}

// Every scenario that loads a target stops at -max-duration, whatever
// the target does: against one that accepts connections and never
// answers, the run ends at its bound with the bound named in its error,
// not when a client timeout (or nothing) ends it.
func TestMaxDurationStopsTheRunAgainstAStalledTarget(t *testing.T) {
	base := stallingListener(t)
	gw := []string{"-dev-secret", testDevSecret}
	for name, c := range map[string]struct {
		scenario, target string
		args             []string
	}{
		"broadcast":        {"broadcast", "baseline:" + base, []string{"-conns", "4", "-dialogs", "2", "-rate", "20"}},
		"idle-connections": {"idle-connections", "baseline:" + base, []string{"-conns", "4"}},
		"broadcast gw":     {"broadcast", base, append([]string{"-conns", "4", "-dialogs", "2", "-rate", "20", "-redis-url", env.Redis.URL(1)}, gw...)},
		"chat-fanout":      {"chat-fanout", base, append([]string{"-users", "4", "-dialogs", "2", "-rate", "4"}, gw...)},
		"connect-storm":    {"connect-storm", base, append([]string{"-conns", "4", "-dialogs", "2", "-wait", "1s"}, gw...)},
		"rate-limit":       {"rate-limit", base, append([]string{"-vus", "2", "-users", "2"}, gw...)},
		"send-sql":         {"send-sql", DefaultTarget, []string{"-database-url", "postgres://u@" + strings.TrimPrefix(base, "http://") + "/db", "-users", "4", "-dialogs", "2", "-rate", "4"}},
		"project-queue":    {"project-queue", base, append([]string{"-project", "p1", "-user", "0b5d6f6e-53a4-4b8e-9a55-1f0d7c1c2a10", "-rate", "4"}, gw...)},
	} {
		t.Run(name, func(t *testing.T) {
			sc := newScenario(t, c.scenario, c.args...)
			bound := 2 * time.Second
			t0 := time.Now()
			sum := run(t, sc, loadtest.Options{Target: c.target, Duration: time.Second, MaxDuration: bound, SourceRange: "none"})
			took := time.Since(t0)
			t.Logf("took %s: %v", took.Round(time.Millisecond), sum.Err)
			if took > bound+3*time.Second {
				t.Errorf("the run took %s, past its -max-duration %s", took.Round(100*time.Millisecond), bound)
			}
			if sum.Err == nil || !strings.Contains(sum.Err.Error(), "hit its 2s bound") {
				t.Errorf("error %v, want one naming the 2s bound the run hit", sum.Err)
			}
		})
	}
}
