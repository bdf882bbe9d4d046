package gateway_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
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

// A subscriber that joins a read under way attaches after the events the
// instance kept beside the read so far: it gets them from that buffer, not
// live. When the buffer then overflows (here on bytes) the joiner gets the
// dialog's resync, and its lastSeq must still cover those events: every
// message after lastSeq comes live, and the client reconciles up to it.
// Taken from the read alone, lastSeq was below them, and they were neither
// replayed, nor live, nor to reconcile.
func TestAJoinerOfAReadWhoseKeptEventsOverflowMissesNoMessage(t *testing.T) {
	const bound = 32 << 10
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverBytes, c.RecoverLinger = bound, time.Minute
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "first")
	read, release := in.svc.HoldRecoveryReads()
	t.Cleanup(release)
	long := func(i int) { in.post(u[0], d, fmt.Sprintf("%02d", i)+strings.Repeat("x", 3998)) }

	a := in.connect(u[1])
	a.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":0}`)
	select { // the read has seen message 1 only
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("no recovery read")
	}
	for i := range 5 { // messages 2-6, kept beside the read
		long(i)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		kept, _, _ := in.svc.RecoveryBuffered(d)
		return kept >= 5*4000
	}, "messages 2-6 were not kept beside the read")
	b := in.connect(u[1])
	b.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":1}`) // joins the read
	testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().Subscriptions == 2 },
		"the second subscribe did not attach")
	for i := range 4 { // messages 7-10: past the bound
		long(5 + i)
	}
	const last = 10
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, full, _ := in.svc.RecoveryBuffered(d)
		return full
	}, "the events kept beside the read did not overflow")
	release()

	for _, sub := range []struct {
		name  string
		c     *client
		since int64
	}{{"leader", a, 0}, {"joiner", b, 1}} {
		r := sub.c.recoveryAnswer(d)
		got := seqs(r.events)
		for len(got) == 0 || got[len(got)-1] < last {
			got = append(got, sub.c.nextCreated().Seq)
		}
		// Recovered: exactly the messages after sinceSeq. Not recovered:
		// every message after lastSeq (a live one at or below it may come
		// too). Either way in order, each once.
		all, want := got, seqRange(sub.since+1, last)
		if r.sub.Recovered == nil || !*r.sub.Recovered {
			if r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable {
				t.Fatalf("%s: not recovered without the dialog's resync: %s", sub.name, r.sub.raw)
			}
			want = seqRange(r.sub.LastSeq+1, last)
			got = got[max(0, len(got)-len(want)):]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || !slices.IsSorted(all) || len(slices.Compact(slices.Clone(all))) != len(all) {
			t.Fatalf("%s: subscribed %s; replayed then live %v, want %v at the end, each once",
				sub.name, r.sub.raw, all, want)
		}
	}
}
