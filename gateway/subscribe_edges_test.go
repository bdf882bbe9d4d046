package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// A member removed from a dialog who subscribes to it again gets
// dialog_not_found, and that ends the subscription it held: none of the
// dialog's later events reaches the socket, and typing there is refused.
func TestResubscribeAfterRemovalEndsTheSubscription(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(2)
	alice, bob := u[0], u[1]
	d := in.dialog(alice, bob)

	a := in.connect(alice)
	a.subscribe(d)
	b := in.connect(bob)
	b.subscribe(d)
	if _, err := pool.Exec(context.Background(), `DELETE FROM dialog_members WHERE dialog_id = $1 AND user_id = $2`, d, bob); err != nil {
		t.Fatal(err)
	}
	b.send(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := b.expect("error"); f.Error != "dialog_not_found" {
		t.Fatalf("resubscribe after removal: %s", f.raw)
	}

	m := in.post(alice, d, "after bob left")
	if f := a.expect("event"); f.Seq != m.Seq {
		t.Fatalf("alice: %s", f.raw)
	}
	// One dispatch queues the event for every local subscriber: had bob
	// still been one, the event would come before the answer to his ping.
	b.send(`{"type":"ping"}`)
	if f := b.expect("pong"); f.Type != "pong" {
		t.Fatalf("bob: %s", f.raw)
	}
	b.send(`{"type":"typing","dialogId":"` + d + `"}`)
	if f := b.expect("error"); f.Error != "not_subscribed" {
		t.Fatalf("typing after the subscription ended: %s", f.raw)
	}
	if st := in.svc.Stats(); st.Subscriptions != 1 {
		t.Fatalf("%d dialog subscriptions, want alice's only", st.Subscriptions)
	}
}

// overflowedClient is a raw client of a new user, subscribed to one busy
// dialog, that stopped reading until its outbound queue (16 frames, a
// 32 KiB socket buffer) overflowed while its socket was full: a
// slow_consumer resync now waits in its queue, and stays there. It also
// returns the instance, the user and a dispatchBarrier.
//
// The first overflow does not prove that: on a starved machine the queue
// can overflow before the socket is full, and the writer then takes the
// resync with the events before it. So the busy dialog gets several times
// what the socket buffers hold (the client never reads, so the writer is
// stuck at last), and then one more event must be dropped as covered by
// the waiting resync. The overflows the slow start may cost do not close
// the connection (MaxOverflows), which is not what these tests are about.
func overflowedClient(t *testing.T) (*instance, string, *rawClient, func()) {
	t.Helper()
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.QueueFrames, c.WriteTimeout, c.SendBuffer, c.MaxOverflows = 16, 30*time.Second, 32<<10, 1000
	}})
	u := in.users(1)[0]
	busy := in.dialog(u)
	rc := in.rawConnect(u)
	rc.write(`{"type":"subscribe","dialogId":"` + busy + `"}`)
	if f := rc.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("%s", f.raw)
	}
	barrier := dispatchBarrier(t, in)
	const size, stuck = 2000, 256 << 10 // far more than the socket buffers hold
	seq := int64(1)
	for ; seq*size < stuck || in.svc.Stats().QueueOverflows == 0; seq++ {
		if seq == 2000 {
			t.Fatal("no overflow")
		}
		publishEvent(t, in, busy, seq, size)
	}
	barrier()
	covered := in.svc.Stats().CoveredDrops
	publishEvent(t, in, busy, seq, size)
	barrier()
	if in.svc.Stats().CoveredDrops == covered {
		t.Fatal("an event was queued after the overflow: no resync waits in the queue")
	}
	return in, u, rc, barrier
}

// dispatchBarrier returns a func that returns once every event published
// to the instance before the call has been dispatched to its sockets. The
// instance hands the Pub/Sub messages it reads to its sockets one after
// the other, in order, so once a message published last reaches a client
// (of another user, on a dialog of its own), all those before it have
// been dispatched.
func dispatchBarrier(t *testing.T, in *instance) func() {
	t.Helper()
	u := in.users(1)[0]
	d := in.dialog(u)
	c := in.connect(u)
	c.subscribe(d)
	return func() {
		t.Helper()
		m := in.post(u, d, "barrier")
		if f := c.expect("event"); f.Seq != m.Seq {
			t.Fatalf("barrier: %s, want seq %d", f.raw, m.Seq)
		}
	}
}

// subscribed with "recovered":true promises that the missed events came
// just before it. A client whose queue has overflowed (a slow_consumer
// resync waits in it, covering every durable event queued after) cannot
// receive a replay: its subscribe with sinceSeq is answered with the
// dialog's recovery_unavailable resync and "recovered":false instead.
func TestRecoveryThatDoesNotFitTheQueueIsNotClaimed(t *testing.T) {
	in, u, rc, _ := overflowedClient(t)
	missed := in.dialog(u)
	for range 3 {
		in.post(u, missed, "missed")
	}
	rc.write(`{"type":"subscribe","dialogId":"` + missed + `","sinceSeq":0}`)
	testenv.Eventually(t, 10*time.Second, func() bool {
		st := in.svc.Stats()
		return st.Recovered+st.RecoverResyncs > 0
	}, "the subscribe with sinceSeq was not answered")

	var replayed []int64
	resynced := false
	for {
		f := rc.read()
		switch {
		case f.Type == "close":
			t.Fatalf("closed: %q", f.raw)
		case f.Type == "event" && f.DialogID == missed:
			replayed = append(replayed, f.Seq)
		case f.Type == "resync" && f.DialogID == missed:
			resynced = true
		case f.Type == "subscribed" && f.DialogID == missed:
			if f.Recovered == nil || f.LastSeq != 3 {
				t.Fatalf("subscribed: %s", f.raw)
			}
			if *f.Recovered && len(replayed) != 3 {
				t.Fatalf("recovered:true after %v of the 3 missed events", replayed)
			}
			if !*f.Recovered && !resynced {
				t.Fatalf("recovered:false without the dialog's resync before it")
			}
			return
		}
	}
}

// Field names are matched exactly: a member whose name differs from a
// protocol field only in case is an unknown field and ignored, so it can
// neither change the frame's type or dialog nor stand in for a missing
// type.
func TestFieldNamesAreMatchedExactly(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	u := in.users(1)[0]
	d1, d2 := in.dialog(u), in.dialog(u)
	c := in.connect(u)

	c.sendRaw(`{"type":"ping","TYPE":"subscribe","dialogId":"` + d1 + `"}`)
	c.expect("pong")
	c.sendRaw(`{"type":"subscribe","dialogId":"` + d1 + `","DialogId":"` + d2 + `"}`)
	if f := c.expect("subscribed"); f.DialogID != d1 {
		t.Fatalf("subscribe to %s answered %s", d1, f.raw)
	}
	c.sendRaw(`{"type":"subscribe","dialogId":"` + d2 + `","SinceSeq":-1}`)
	if f := c.expect("subscribed"); f.DialogID != d2 || f.Recovered != nil {
		t.Fatalf("subscribe to %s without sinceSeq answered %s", d2, f.raw)
	}
	c.sendRaw(`{"Type":"ping"}`)
	if f := c.expect("error"); f.Error != "invalid_frame" {
		t.Fatalf("a frame without type: %s", f.raw)
	}
}

// A resync without a dialogId covers the dialogs subscribed before it.
// A client whose queue overflowed (its slow_consumer resync still waits
// in the queue) and who subscribes to a dialog then must still learn of
// every message of that dialog after lastSeq: delivered, or covered by a
// resync that comes after its subscribed frame.
func TestSubscribeBehindAQueuedResyncMissesNothing(t *testing.T) {
	in, u, rc, barrier := overflowedClient(t)
	fresh := in.dialog(u)
	rc.write(`{"type":"subscribe","dialogId":"` + fresh + `"}`)
	testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().Subscriptions == 2 }, "the subscribe was not answered")
	m := in.post(u, fresh, "after subscribed")
	// Once the message was dispatched, the pong answering a ping comes
	// after whatever it left in the queue.
	barrier()
	rc.write(`{"type":"ping"}`)

	subscribed, told := false, false
	for {
		f := rc.read()
		switch {
		case f.Type == "close":
			t.Fatalf("closed: %q", f.raw)
		case f.Type == "subscribed" && f.DialogID == fresh:
			// A lastSeq read after the message's commit covers it.
			subscribed, told = true, f.LastSeq >= m.Seq
		case subscribed && (f.Type == "resync" || f.Type == "event" && f.Seq == m.Seq):
			told = true
		case f.Type == "pong":
			if !subscribed || !told {
				t.Fatalf("subscribed %v; message %d of the dialog neither delivered nor covered by a resync after it", subscribed, m.Seq)
			}
			return
		}
	}
}
