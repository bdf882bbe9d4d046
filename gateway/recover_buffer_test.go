package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
)

// Beside a recovery read the instance keeps the dialog's messages
// dispatched since the read began, for the subscribes that join it. It
// kept up to RecoverMax of them whatever their size (1–2 MB with the
// longest bodies, per dialog being read), though a replay past
// RecoverBytes is a resync anyway. It now keeps at most RecoverBytes: past
// that the read serves no later subscribe, and those get a read of their
// own, answered as they would have been.
func TestEventsKeptBesideARecoveryReadStayWithinTheByteBound(t *testing.T) {
	const bound = 32 << 10
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverBytes, c.RecoverLinger = bound, time.Minute
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "first")
	a := in.connect(u[1])
	if r := a.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != "[1]" {
		t.Fatalf("first recovery: %v %s", seqs(r.events), r.sub.raw)
	}
	// a keeps the dialog's channel, so its read lingers and keeps what
	// the instance dispatches.
	const n = 20 // ≈ 4.2 KB a frame: ≈ 84 KB in all
	for i := range n {
		in.post(u[0], d, fmt.Sprintf("%02d", i)+strings.Repeat("x", 3998))
		if err := keptWithin(in, d, bound); err != nil {
			t.Fatalf("after message %d: %v", i+2, err)
		}
	}
	for i := range n {
		if f := a.nextCreated(); f.Seq != int64(i+2) {
			t.Fatalf("live: seq %d, want %d", f.Seq, i+2)
		}
	}
	if err := keptWithin(in, d, bound); err != nil {
		t.Fatal(err)
	}

	// A socket that missed the 20 long messages gets the resync (their
	// frames exceed the bound); one that missed only the last two is
	// recovered.
	b := in.connect(u[1])
	r := b.subscribeSince(d, 1)
	if r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable || len(r.events) != 0 ||
		r.sub.Recovered == nil || *r.sub.Recovered || r.sub.LastSeq != n+1 {
		t.Fatalf("sinceSeq 1: replayed %v, resync %v, subscribed %s", seqs(r.events), r.resync, r.sub.raw)
	}
	c := in.connect(u[1])
	r = c.subscribeSince(d, n-1)
	if fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(n, n+1)) || r.resync != nil || r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("sinceSeq %d: replayed %v, resync %v, subscribed %s", n-1, seqs(r.events), r.resync, r.sub.raw)
	}
	// And every socket gets the next message live, once.
	m := in.post(u[0], d, "after")
	for _, s := range []*client{a, b, c} {
		if f := s.nextCreated(); f.Seq != m.Seq {
			t.Fatalf("live: seq %d, want %d", f.Seq, m.Seq)
		}
	}
}

// keptWithin fails when the events kept beside the dialog's current read
// exceed bound bytes.
func keptWithin(in *instance, d string, bound int) error {
	kept, full, ok := in.svc.RecoveryBuffered(d)
	if ok && kept > bound {
		return fmt.Errorf("%d bytes of frames kept beside the read (overflowed: %v), want at most %d", kept, full, bound)
	}
	return nil
}
