package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
)

// A recovery read of a dialog whose missed messages are long builds and
// keeps at most RecoverBytes of frames: past that bound its subscriber is
// answered with the dialog's resync, and it used to build every frame up
// to RecoverMax+1 first (≈ 2 MB with the longest bodies) and keep them all
// for RecoverLinger. What it keeps still serves a later subscribe that
// needs only the newest messages.
func TestRecoveryReadOfLongMessagesKeepsAtMostTheByteBound(t *testing.T) {
	const bound = 32 << 10
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverBytes, c.RecoverLinger = bound, time.Minute
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	const n = 20 // ≈ 4.2 KB a frame: ≈ 84 KB in all
	for i := range n {
		in.post(u[0], d, fmt.Sprintf("%02d", i)+strings.Repeat("x", 3998))
	}
	a := in.connect(u[1])
	r := a.subscribeSince(d, 0)
	if r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable || len(r.events) != 0 ||
		r.sub.Recovered == nil || *r.sub.Recovered || r.sub.LastSeq != n {
		t.Fatalf("%d missed messages of 4 KB past a %d-byte bound: replayed %v, resync %v, subscribed %s",
			n, bound, seqs(r.events), r.resync, r.sub.raw)
	}
	kept, ok := in.svc.RecoveryKept(d)
	if !ok || kept == 0 || kept > bound {
		t.Fatalf("the read keeps %d bytes of frames (lingering: %v), want some and at most %d", kept, ok, bound)
	}
	// Another socket that missed only the last two joins the same read.
	b := in.connect(u[1])
	r = b.subscribeSince(d, n-2)
	if fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(n-1, n)) || r.resync != nil || r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("sinceSeq %d: replayed %v, resync %v, subscribed %s", n-2, seqs(r.events), r.resync, r.sub.raw)
	}
	if st := in.svc.Stats(); st.RecoverReads != 1 {
		t.Fatalf("%d recovery reads, want the one both subscribes shared", st.RecoverReads)
	}
}
