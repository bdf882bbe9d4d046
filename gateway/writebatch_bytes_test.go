package gateway_test

import (
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// QueueBytes bounds what the server holds for a socket, the batch its
// writer has taken from the queue and is still writing included. A client
// that stopped reading while its writer had just taken a full queue used
// to make the server hold that batch, blocked in the write, and a second
// full queue behind it: twice the bound. Now the events that do not fit
// beside the batch being written are replaced by one resync, as when the
// queue alone overflows.
//
// The measure is the client's own: it reads nothing while the events are
// published, so every event it gets once it reads again, before its
// resync, was held for it at once — by the server, or by the two sockets'
// kernel buffers, which the test keeps small.
func TestTheBatchBeingWrittenCountsAgainstTheQueueBytes(t *testing.T) {
	const (
		queueBytes = 256 << 10
		// What the kernel holds between the two ends: the server's send
		// buffer (capped at 4 KiB) and the client's receive buffer (4 KiB,
		// rawConnect), each doubled by the kernel, and what the client's
		// reader buffered; a generous allowance for both.
		kernelBytes = 64 << 10
		n, size     = 56, 4000 // ≈ 4.2 KB frames: n of them ≈ 93 % of queueBytes
	)
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.QueueBytes, c.QueueFrames = queueBytes, 1024
		c.WriteTimeout, c.SendBuffer = time.Minute, 4096
	}})
	u := in.users(1)
	d := in.dialog(u...)
	rc := in.rawConnect(u[0])
	rc.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := rc.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("want subscribed, got %s", f.raw)
	}
	// From here on the client reads nothing until the last event is
	// published.

	// The queue fills while no writer runs, then the writer takes all of
	// it as one batch and blocks on the client.
	var release func()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var ok bool
		release, ok = in.svc.HoldWrites(u[0])
		return ok
	}, "the connection's writer did not finish")
	t.Cleanup(release)
	seq := int64(0)
	for range n {
		seq++
		publishEvent(t, in, d, seq, size)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, durable, _ := in.svc.ConnHeld(u[0])
		return durable == n
	}, "the first %d events did not reach the connection's queue", n)
	release()
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, durable, _ := in.svc.ConnHeld(u[0])
		return durable == 0
	}, "the writer did not take the queued events")

	// As many again, each queued or given up before the next.
	overflows := in.svc.Stats().QueueOverflows
	var last string
	for i := 1; i <= n; i++ {
		seq++
		last = publishEvent(t, in, d, seq, size)
		testenv.Eventually(t, 10*time.Second, func() bool {
			_, durable, _ := in.svc.ConnHeld(u[0])
			return durable == i || in.svc.Stats().QueueOverflows > overflows
		}, "event %d did not reach the connection", i)
		if queued, _, pending := in.svc.ConnHeld(u[0]); queued+pending > queueBytes {
			t.Fatalf("the server counts %d bytes queued or being written and %d pending for one connection; want at most %d",
				queued, pending, queueBytes)
		}
		if in.svc.Stats().QueueOverflows > overflows {
			break
		}
	}

	// The client reads again: every event before the resync (or, without
	// one, through the last event) was held for it at once.
	held, events := 0, 0
	for {
		f := rc.read()
		if f.Type == "resync" {
			if f.DialogID != "" || f.Reason != gateway.ResyncSlowConsumer {
				t.Fatalf("unexpected resync: %s", f.raw)
			}
			break
		}
		if f.Type != "event" {
			t.Fatalf("unexpected frame: %s", f.raw)
		}
		if f.Event != pubsub.EventMessageCreated {
			continue
		}
		held += len(f.raw)
		events++
		if f.ID == last {
			break
		}
	}
	if held > queueBytes+kernelBytes {
		t.Fatalf("a client that read nothing got %d events (%d bytes) at once; the server may hold %d bytes for it, the sockets' buffers at most %d more",
			events, held, queueBytes, kernelBytes)
	}
	if events < n {
		t.Fatalf("got %d events before the resync, want at least the %d of the batch being written", events, n)
	}
	t.Logf("the client got %d events (%d bytes) before its resync", events, held)

	// Written, the batch no longer counts: the connection holds nothing,
	// and the next event reaches the client whole.
	testenv.Eventually(t, 10*time.Second, func() bool {
		queued, _, _ := in.svc.ConnHeld(u[0])
		return queued == 0
	}, "the written batch still counts against the connection's bytes")
	overflows = in.svc.Stats().QueueOverflows
	seq++
	next := publishEvent(t, in, d, seq, size)
	for {
		f := rc.read()
		if f.Type == "resync" {
			t.Fatalf("the event after the batch was written overflowed: %s", f.raw)
		}
		if f.ID == next {
			break
		}
	}
	if st := in.svc.Stats(); st.QueueOverflows != overflows {
		t.Fatalf("queue overflows went from %d to %d", overflows, st.QueueOverflows)
	}
}
