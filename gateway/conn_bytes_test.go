package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// QueueBytes bounds what one socket makes the server hold, not what each
// of its parts may: the outbound queue and the live events a subscription
// waiting for its subscribed frame holds count together. A client taking
// nothing from a busy dialog while it subscribes to another used to make
// the server hold a full queue for the first and as much again for the
// second. Past the bound the waiting subscription lets go of its events,
// whichever dialog's events come first, and its subscribed frame is
// followed by a resync, as when its own events overflow; the live
// dialog's events are all delivered.
func TestAConnectionHoldsAtMostTheQueueBytesInAll(t *testing.T) {
	for _, waitingFirst := range []bool{false, true} {
		name := map[bool]string{false: "live_dialog_first", true: "waiting_dialog_first"}[waitingFirst]
		t.Run(name, func(t *testing.T) { testConnectionBytes(t, waitingFirst) })
	}
}

func testConnectionBytes(t *testing.T, waitingFirst bool) {
	openPool(t) // migrates the database the proxy fronts
	proxy, pgURL := newStallingPG(t, "AS fresh")
	stalled, err := store.OpenPG(context.Background(), pgURL, store.PGConfig{MaxConns: 8, ExecMode: pgx.QueryExecModeSimpleProtocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalled.Close)
	const queueBytes = 64 << 10
	in := newInstance(t, stalled, opts{hub: func(c *gateway.Config) { c.QueueBytes, c.QueueFrames = queueBytes, 1024 }})
	t.Cleanup(proxy.unblock) // before the instance closes, should the test fail first
	u := in.users(2)
	live := in.dialog(u[0])
	waiting := in.dialog(u[0], u[1])
	in.post(u[1], waiting, "known")

	rc := in.rawConnect(u[0])
	rc.write(`{"type":"subscribe","dialogId":"` + live + `"}`)
	if f := rc.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("want subscribed, got %s", f.raw)
	}
	// The recovery read of the second subscribe has run; its answer is
	// held back, so the subscription waits, holding its dialog's events.
	rc.write(`{"type":"subscribe","dialogId":"` + waiting + `","sinceSeq":1}`)
	select {
	case <-proxy.answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery read did not run")
	}
	// Nothing is written to the client for a while, as when it takes
	// nothing. Each dialog gets ≈ 58 KB of events: under the bound on its
	// own (the queue does not overflow), about twice the bound together.
	var release func()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var ok bool
		release, ok = in.svc.HoldWrites(u[0])
		return ok
	}, "the connection's writer did not finish")
	t.Cleanup(release)
	const n, size = 28, 1800
	publish := func(d string, seq0 int64) {
		for i := range n {
			publishEvent(t, in, d, seq0+int64(i), size)
		}
	}
	if waitingFirst {
		publish(waiting, 2)
		publish(live, 1)
	} else {
		publish(live, 1)
		publish(waiting, 2)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		frames, _, overflowed := in.svc.PendingHeld(waiting)
		_, durable, _ := in.svc.ConnHeld(u[0])
		return durable == n && (frames == n || overflowed)
	}, "the %d events of each dialog did not reach the connection", n)
	if queued, _, pending := in.svc.ConnHeld(u[0]); queued+pending > queueBytes {
		t.Fatalf("one connection holds %d bytes queued and %d held for a waiting subscription, %d in all; want at most %d",
			queued, pending, queued+pending, queueBytes)
	}

	release()
	proxy.unblock()
	// The client takes its frames again: every live event, the waiting
	// dialog's subscribed frame, then a resync for every dialog, which has
	// the client reconcile what the waiting subscription let go of.
	var events int
	var subscribed bool
	for {
		f := rc.readSkipPresence()
		if f.Type == "resync" && f.DialogID == "" && f.Reason == gateway.ResyncSlowConsumer {
			break
		}
		switch {
		case f.Type == "event" && f.Event == pubsub.EventMessageCreated && f.DialogID == live && !subscribed:
			events++
		case f.Type == "subscribed" && f.DialogID == waiting && !subscribed:
			subscribed = true
		default:
			t.Fatalf("unexpected frame (after %d live events, subscribed %v): %s", events, subscribed, f.raw)
		}
	}
	if events != n || !subscribed {
		t.Fatalf("got %d of the live dialog's %d events and subscribed %v before the resync", events, n, subscribed)
	}
	if st := in.svc.Stats(); st.QueueOverflows != 0 {
		t.Fatalf("the live dialog's events overflowed the queue: %+v", st)
	}
}
