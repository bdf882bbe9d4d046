package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Closing the instance after a drain that ran out of its budget ends at
// once, even when the clients never answer the close frame: every socket
// is in a close handshake that waits (5 s in the WebSocket library) for
// the client's reply, and closing the sockets one after another waited for
// each handshake instead of ending it, so the instance overran its stop
// budget by seconds.
func TestCloseAfterAnUnfinishedDrainEndsSilentClientsAtOnce(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	const n = 20
	for _, u := range in.users(n) {
		ws, _, err := in.dialRaw(dialOpts{token: token(t, u)})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, b, err := ws.Read(ctx) // the hello; then this client never reads again
		cancel()
		if err != nil || !strings.Contains(string(b), `"type":"hello"`) {
			t.Fatalf("first frame %s, %v", b, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := in.svc.Drain(ctx); err == nil {
		t.Fatal("a drain of clients that never answer the close frame finished within 300 ms")
	}
	start := time.Now()
	in.svc.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close after the unfinished drain took %v: it waited for the silent clients' close handshakes", took.Round(10*time.Millisecond))
	}
	if st := in.svc.Stats(); st.Connections != 0 {
		t.Fatalf("%d connections left after Close", st.Connections)
	}
}
