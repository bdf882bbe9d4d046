package gateway_test

import (
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// Events for a dialog with few subscribers on the instance are written by
// the goroutine that dispatches them, in one write that never blocks. A
// client that stops reading fills its socket: the write takes part of an
// event's bytes and a writer goroutine finishes it. When the client reads
// again it gets every event whole (its frame and JSON intact) and in
// publish order, with no resync.
func TestInlineWritesLeaveTheRestToTheWriter(t *testing.T) {
	in, rc, d := rawSubscriber(t, 4096, 30*time.Second, 8<<10)
	before := in.svc.Stats()

	// The client does not read while events arrive until the socket is
	// full and an inline write left bytes to a writer (bounded).
	var ids []string
	for seq := int64(1); seq <= 400 && in.svc.Stats().InlineLeftovers == before.InlineLeftovers; seq++ {
		ids = append(ids, publishEvent(t, in, d, seq, 1500))
		testenv.Eventually(t, 10*time.Second, func() bool {
			st := in.svc.Stats()
			return st.InlineWrites+st.InlineLeftovers >= before.InlineWrites+before.InlineLeftovers+uint64(len(ids))
		}, "event %d was not written inline", seq)
	}
	st := in.svc.Stats()
	if st.InlineLeftovers == before.InlineLeftovers {
		t.Fatalf("no inline write left bytes to a writer after %d events of 1.5 KB to a client not reading: %+v", len(ids), st)
	}
	if st.InlineWrites == before.InlineWrites {
		t.Fatalf("no event was written inline: %+v", st)
	}
	// A few more while the writer owns the connection: they queue behind
	// the rest it is flushing.
	for i := 0; i < 5; i++ {
		ids = append(ids, publishEvent(t, in, d, int64(len(ids)+1), 1500))
	}
	for i, id := range ids {
		f := rc.readSkipPresence()
		if f.Type != "event" || f.ID != id || f.Seq != int64(i+1) {
			t.Fatalf("frame %d: want event %s seq %d, got %s", i, id, i+1, f.raw)
		}
	}
	if st := in.svc.Stats(); st.QueueOverflows != 0 || st.Resyncs != 0 || st.SlowConsumerCloses != 0 {
		t.Fatalf("the client kept up in the end, yet: %+v", st)
	}
	// The connection is still served inline afterwards.
	w := in.svc.Stats().InlineWrites
	last := publishEvent(t, in, d, int64(len(ids)+1), 10)
	if f := rc.readSkipPresence(); f.ID != last {
		t.Fatalf("after the rest: %s", f.raw)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return in.svc.Stats().InlineWrites > w }, "the next event was not written inline")
}

// A client that sends pings and never reads (here under a frame rate
// that lets it) fills its socket with pongs, and the pong write blocks
// (until the write timeout ends the connection), holding the socket's
// write lock. An event for a dialog it shares with a reading client must
// not wait for that write: the reading client gets it while the stuck one
// is still connected.
func TestBlockedPongDoesNotStallDispatch(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.WriteTimeout, c.SendBuffer = 30*time.Second, 8<<10
		c.FrameRate, c.FrameBurst = 1e6, 1e6
	}})
	users := in.users(2)
	d := in.dialog(users...)
	stuck := in.rawConnect(users[0]) // subscribed first: dispatched to first
	stuck.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := stuck.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("%s", f.raw)
	}
	reader := in.connect(users[1])
	reader.subscribe(d)

	// Pings (125-byte payloads) until the server's pong writes block: its
	// send buffer and the client's receive buffer are small, and nothing
	// is read. The writes stop when the server stops reading.
	ping := append([]byte{0x89, 0x80 | 125, 1, 2, 3, 4}, make([]byte, 125)...)
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		for range 4000 {
			_ = stuck.nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := stuck.nc.Write(ping); err != nil {
				return
			}
		}
	}()
	<-pinged
	if n := in.svc.Stats().Connections; n != 2 {
		t.Fatalf("%d connections before the event, want the stuck one still open", n)
	}
	// Two events: whatever the order of the two sockets in the dialog's
	// list, a dispatch stuck on the first event's write to the stuck
	// socket would hold back the second.
	publishEvent(t, in, d, 1, 100)
	id := publishEvent(t, in, d, 2, 100)
	for {
		f := reader.next(20 * time.Second)
		if f.Type == "event" && f.ID == id {
			break
		}
	}
	if n := in.svc.Stats().Connections; n != 2 {
		t.Fatalf("the events reached the reading client only after the stuck one was closed (%d connections)", n)
	}
}
