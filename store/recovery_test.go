package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// RecoverDialog reads the newest messages after a seq with the frames the
// send path published for them, and tells which it cannot replay: outside
// the window, or without an outbox event.
func TestRecoverDialog(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	a, _, dialogID := twoUsers(t, st)
	published := map[int64]string{}
	for i := 0; i < 5; i++ {
		m, ev, _, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: dialogID, SenderID: a, Body: "m", Event: i != 3})
		if err != nil {
			t.Fatal(err)
		}
		published[m.Seq] = string(ev.Payload)
	}
	r, err := st.RecoverDialog(ctx, dialogID, 1, time.Minute, 10, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.LastSeq != 5 || !r.Complete || len(r.Events) != 4 {
		t.Fatalf("after 1: %+v", r)
	}
	for i, e := range r.Events {
		switch {
		case e.Seq != int64(i+2):
			t.Fatalf("event %d has seq %d", i, e.Seq)
		case e.Seq == 4 && e.Frame != nil:
			t.Fatalf("seq 4 had no outbox event, yet a frame %s", e.Frame)
		case e.Seq != 4 && string(e.Frame) != published[e.Seq]:
			t.Fatalf("seq %d frame %s, published %s", e.Seq, e.Frame, published[e.Seq])
		}
	}
	// The newest limit only, and not complete.
	if r, err := st.RecoverDialog(ctx, dialogID, 0, time.Minute, 2, 1<<20); err != nil || r.Complete || len(r.Events) != 2 ||
		r.Events[0].Seq != 4 || r.Events[1].Seq != 5 {
		t.Fatalf("limit 2: %+v %v", r, err)
	}
	// Outside the window: no frame.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '2 minutes'
		WHERE message_id = (SELECT id FROM messages WHERE dialog_id = $1 AND seq = 5)`, dialogID); err != nil {
		t.Fatal(err)
	}
	if r, err := st.RecoverDialog(ctx, dialogID, 4, time.Minute, 10, 1<<20); err != nil || len(r.Events) != 1 || r.Events[0].Frame != nil {
		t.Fatalf("old row: %+v %v", r, err)
	}
	// Nothing after the last seq; an unknown dialog.
	if r, err := st.RecoverDialog(ctx, dialogID, 5, time.Minute, 10, 1<<20); err != nil || len(r.Events) != 0 || !r.Complete || r.LastSeq != 5 {
		t.Fatalf("up to date: %+v %v", r, err)
	}
	if _, err := st.RecoverDialog(ctx, ids.New(), 0, time.Minute, 10, 1<<20); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("unknown dialog: %v", err)
	}
}
