package gateway_test

import (
	"testing"
	"time"

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
			return st.InlineWrites+st.InlineLeftovers > before.InlineWrites+before.InlineLeftovers+uint64(len(ids))-1 ||
				st.InlineLeftovers > before.InlineLeftovers
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
		f := rc.read()
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
	if f := rc.read(); f.ID != last {
		t.Fatalf("after the rest: %s", f.raw)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return in.svc.Stats().InlineWrites > w }, "the next event was not written inline")
}
