package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// RecoverDialog bounds the frames it builds by bytes as it reads, newest
// first: it stops at the message whose frame takes the total past the
// bound and returns that one without its frame, not Complete; a bound
// that every frame fits in changes nothing.
func TestRecoverDialogStopsPastTheByteBound(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	a, _, dialogID := twoUsers(t, st)
	const n = 10
	published := map[int64]string{}
	for range n {
		m, ev, _, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: dialogID, SenderID: a,
			Body: strings.Repeat("€", 4000), Event: true})
		if err != nil {
			t.Fatal(err)
		}
		published[m.Seq] = string(ev.Payload)
	}
	newest3 := len(published[n]) + len(published[n-1]) + len(published[n-2])
	for _, bound := range []int{newest3, newest3 + len(published[n-3]) - 1} {
		r, err := st.RecoverDialog(ctx, dialogID, 0, time.Minute, n+1, bound)
		if err != nil {
			t.Fatal(err)
		}
		if r.LastSeq != n || r.Complete || len(r.Events) != 4 {
			t.Fatalf("bound %d: last %d, complete %v, %d events; want %d, false, 4", bound, r.LastSeq, r.Complete, len(r.Events), n)
		}
		kept := 0
		for i, e := range r.Events {
			switch {
			case e.Seq != int64(n-3+i):
				t.Fatalf("bound %d: event %d has seq %d", bound, i, e.Seq)
			case i == 0 && e.Frame != nil:
				t.Fatalf("bound %d: seq %d's frame takes the total past the bound, yet it was kept", bound, e.Seq)
			case i > 0 && string(e.Frame) != published[e.Seq]:
				t.Fatalf("bound %d: seq %d frame %.40s…, published %.40s…", bound, e.Seq, e.Frame, published[e.Seq])
			}
			kept += len(e.Frame)
		}
		if kept > bound {
			t.Fatalf("bound %d: %d bytes of frames kept", bound, kept)
		}
	}
	r, err := st.RecoverDialog(ctx, dialogID, 0, time.Minute, n+1, n*len(published[n])+1000)
	if err != nil || !r.Complete || len(r.Events) != n || r.Events[0].Frame == nil {
		t.Fatalf("every frame within the bound: %d events, complete %v, %v", len(r.Events), r.Complete, err)
	}
}
