package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// Until a subscription is answered with subscribed, the dialog's live
// events wait for it, and that wait is bounded by bytes as the outbound
// queue is, not only by count: a busy dialog of long messages used to
// make each such subscription hold QueueFrames of its frames, megabytes
// per connection, which the queue could never take at once anyway. Past
// the bound the subscription keeps nothing, and its subscribed frame is
// followed by a resync, so the client reconciles and loses nothing.
func TestAPendingSubscriptionHoldsAtMostTheQueueBytes(t *testing.T) {
	openPool(t) // migrates the database the proxy fronts
	proxy, pgURL := newStallingPG(t, "AS fresh")
	stalled, err := store.OpenPG(context.Background(), pgURL, store.PGConfig{MaxConns: 8, ExecMode: pgx.QueryExecModeSimpleProtocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalled.Close)
	const queueBytes = 1 << 20 // the default, stated
	in := newInstance(t, stalled, opts{hub: func(c *gateway.Config) { c.QueueBytes = queueBytes }})
	t.Cleanup(proxy.unblock) // before the instance closes, should the test fail first
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "known")
	c := in.connect(u[1])

	// The recovery read has run; its answer is held back, so the
	// subscription waits, holding the dialog's live events.
	c.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":1}`)
	select {
	case <-proxy.answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery read did not run")
	}
	// The longest bodies in 3-byte characters: ≈ 12 KB a frame, 100 of
	// them (well under QueueFrames) ≈ 1.2 MB, past the 1 MiB queue bound.
	long := strings.Repeat("€", 4000)
	const n = 100
	for range n {
		in.post(u[0], d, long)
	}
	var frames, held int
	var overflowed bool
	testenv.Eventually(t, 10*time.Second, func() bool {
		frames, held, overflowed = in.svc.PendingHeld(d)
		return frames == n || overflowed
	}, "the %d live events did not reach the waiting subscription", n)
	if held > queueBytes || !overflowed {
		t.Fatalf("a waiting subscription holds %d frames, %d bytes (gave up: %v); want at most the queue's %d bytes",
			frames, held, overflowed, queueBytes)
	}

	proxy.unblock()
	r := c.collectUntilSubscribed(d)
	if r.sub.Recovered == nil || !*r.sub.Recovered || r.sub.LastSeq != 1 || len(r.events) != 0 {
		t.Fatalf("subscribed %s after %d replayed events, want recovered at lastSeq 1 with none", r.sub.raw, len(r.events))
	}
	// Whatever live events follow, a resync for every dialog comes: the
	// client reconciles over REST and finds every message.
	c.send(`{"type":"ping"}`)
	for {
		f := c.next(10 * time.Second)
		if f.Type == "resync" && f.DialogID == "" && f.Reason == gateway.ResyncSlowConsumer {
			break
		}
		if f.Type == "pong" {
			t.Fatal("the events the waiting subscription dropped were not followed by a resync")
		}
		if f.Type != "event" || f.Event == pubsub.EventMessageCreated && f.DialogID != d {
			t.Fatalf("unexpected frame: %s", f.raw)
		}
	}
	if got := in.history(d, 1); len(got) != n {
		t.Fatalf("reconciling finds %d messages after seq 1, want %d", len(got), n)
	}
}
