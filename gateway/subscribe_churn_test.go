package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
)

// One socket alternating subscribe-with-sinceSeq and unsubscribe on one
// dialog: each cycle's read stops serving joiners when the dialog's
// channel empties, so every subscribe needed a PostgreSQL recovery read of
// its own, as fast as the socket's frame rate allowed (≈ 10 a second, 160
// for a user's 16 sockets). A user's subscribes now lead at most their
// recovery reads on the instance (burst, then the rate); past them the
// subscribe is still answered, with the dialog's resync and a lastSeq
// after which every message comes live exactly once. Another user's
// subscribe still gets its read, and a subscribe served by a read already
// made costs none.
func TestSubscribeChurnCostsAtMostTheUsersRecoveryReads(t *testing.T) {
	const burst = 5
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverReadBurst, c.RecoverReadRate = burst, 0.001 // none comes back during the test
		c.RecoverLinger = time.Minute
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	for i := range 3 {
		in.post(u[1], d, fmt.Sprint(i))
	}
	c := in.connect(u[0])
	before := in.svc.Stats().RecoverReads
	const cycles = 25
	for i := range cycles {
		r := c.subscribeSince(d, 0)
		if i < burst {
			if fmt.Sprint(seqs(r.events)) != "[1 2 3]" || r.resync != nil || r.sub.Recovered == nil || !*r.sub.Recovered || r.sub.LastSeq != 3 {
				t.Fatalf("cycle %d, within the budget: replayed %v, resync %v, subscribed %s", i, seqs(r.events), r.resync, r.sub.raw)
			}
		} else if r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable || r.resync.DialogID != d ||
			len(r.events) != 0 || r.sub.Recovered == nil || *r.sub.Recovered || r.sub.LastSeq != 3 {
			t.Fatalf("cycle %d, past the budget: replayed %v, resync %v, subscribed %s", i, seqs(r.events), r.resync, r.sub.raw)
		}
		if i == cycles-1 {
			break // stays subscribed
		}
		c.send(`{"type":"unsubscribe","dialogId":"` + d + `"}`)
	}
	if n := in.svc.Stats().RecoverReads - before; n != burst {
		t.Fatalf("%d recovery reads for %d subscribe/unsubscribe cycles of one socket on one dialog, want the user's %d", n, cycles, burst)
	}
	// The subscription answered past the budget is live from its lastSeq.
	m := in.post(u[1], d, "live")
	if f := c.nextCreated(); f.Seq != m.Seq {
		t.Fatalf("live after a resync answer: seq %d, want %d", f.Seq, m.Seq)
	}
	c.send(`{"type":"ping"}`)
	c.expect("pong") // and nothing else before it: no duplicate

	// The bound is the user's: the other member, on the same instance,
	// gets a read (the channel has a subscriber again, so it lingers).
	c.send(`{"type":"unsubscribe","dialogId":"` + d + `"}`)
	o := in.connect(u[1])
	if r := o.subscribeSince(d, 2); fmt.Sprint(seqs(r.events)) != "[3 4]" || r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("another user: replayed %v, resync %v, subscribed %s", seqs(r.events), r.resync, r.sub.raw)
	}
	// A subscribe that a read under way or lingering serves costs no read:
	// the user with no read left is recovered from the other user's.
	if r := c.subscribeSince(d, 3); fmt.Sprint(seqs(r.events)) != "[4]" || r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("joining a lingering read with no read left: replayed %v, resync %v, subscribed %s", seqs(r.events), r.resync, r.sub.raw)
	}
	if n := in.svc.Stats().RecoverReads - before; n != burst+1 {
		t.Fatalf("%d recovery reads, want %d", n, burst+1)
	}
}
