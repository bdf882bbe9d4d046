package scenarios

import (
	"context"
	"net/http"
	"net/http/httptest"
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
