package gateway_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/pubsub"
)

// A batch's write deadline stays on the socket after the batch; a
// connection must not trip over it once it has passed. Long after its last
// batch the connection answers the client's WebSocket ping, sends its own
// pings, answers a protocol ping and delivers events, and nobody is closed
// as a slow consumer.
func TestConnectionOutlivesItsLastBatchDeadline(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) {
		c.WriteTimeout, c.PingInterval = writeTimeout, 2*writeTimeout
	}})
	users := in.users(2)
	d := in.dialog(users...)
	c := in.connect(users[0])
	c.subscribe(d) // a batch: its deadline passes during the sleep below

	time.Sleep(3 * writeTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Ping(ctx); err != nil {
		t.Fatalf("no pong to a WebSocket ping after the last batch's deadline passed: %v", err)
	}
	time.Sleep(3 * writeTimeout) // the server pings at least once meanwhile
	c.send(`{"type":"ping"}`)
	c.expect("pong")

	time.Sleep(3 * writeTimeout)
	id := publishEvent(t, in, d, 1, 100)
	if f := c.expect("event"); f.ID != id {
		t.Fatalf("event %s, want %s", f.ID, id)
	}
	if st := in.svc.Stats(); st.SlowConsumerCloses != 0 || st.Connections != 1 {
		t.Fatalf("after idle periods longer than the write timeout: %+v", st)
	}
}

// Messages of every payload-length encoding of a WebSocket frame (7-bit,
// 16-bit and 64-bit lengths, at their boundaries) arrive intact and in
// order, published back to back so that they share batches.
func TestEventsOfEveryFrameLength(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	users := in.users(2)
	d := in.dialog(users...)
	c := in.connect(users[0])
	c.subscribe(d)

	sizes := []int{70, 125, 126, 127, 1000, 65535, 65536, 200000}
	want := make([]string, len(sizes))
	for i, n := range sizes {
		head := `{"type":"event","event":"test.size","id":"` + strconv.Itoa(i) + `","data":{"pad":"`
		want[i] = head + strings.Repeat("x", n-len(head)-3) + `"}}`
		if len(want[i]) != n {
			t.Fatalf("payload %d has %d bytes", i, len(want[i]))
		}
	}
	for _, p := range want {
		if err := in.rt.Publish(context.Background(), pubsub.DialogChannel(d), p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range want {
		if f := c.expect("event"); string(f.raw) != p {
			t.Fatalf("message %d (%d bytes): got %d bytes, id %q", i, len(p), len(f.raw), f.ID)
		}
	}
}

// A connection the server closes for a protocol violation while events are
// streaming to it gets the close frame with its code, not a cut
// connection: the writer stops writing data once closing starts and leaves
// the close handshake alone.
func TestPolicyCloseDuringFanOutKeepsItsCode(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	users := in.users(2)
	d := in.dialog(users...)
	c := in.connect(users[0])
	c.subscribe(d)

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 300; i++ {
			p := `{"type":"event","event":"test.stream","id":"` + strconv.Itoa(i) + `","data":{}}`
			if in.rt.Publish(context.Background(), pubsub.DialogChannel(d), p).Err() != nil {
				return
			}
		}
	}()
	time.Sleep(5 * time.Millisecond) // let the stream start
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.ws.Write(ctx, websocket.MessageText, []byte(strings.Repeat("x", 8000))) // over the frame limit
	if code, reason := c.closeStatus(10 * time.Second); code != gateway.ClosePolicy || reason != "frame too big" {
		t.Fatalf("close %d %q, want 1008 %q", code, reason, "frame too big")
	}
	<-done
}
