package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// flood starts n sends of sender into the dialog at once and waits until
// each of them reached the store: held in the dialog's queue, or already
// answered. It returns how many the queue holds and the answers' channel
// (room for all n).
func flood(t *testing.T, s *store.Store, dialog, sender string, n int) (held int, outs chan sendOutcome) {
	t.Helper()
	before := s.SendQueueDepth(dialog)
	outs = make(chan sendOutcome, n)
	for i := range n {
		go func() {
			m, _, created, err := s.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: dialog,
				SenderID: sender, Body: fmt.Sprintf("flood %d", i), ClientMessageID: ids.New()})
			outs <- sendOutcome{m, created, err}
		}()
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return len(outs)+s.SendQueueDepth(dialog)-before == n
	}, "%d sends never all reached the store", n)
	return s.SendQueueDepth(dialog) - before, outs
}

// A dialog's queue (HAN_SEND_DIALOG_QUEUE) is shared among its senders: one
// sender's many concurrent sends into a dialog, a member's or an
// outsider's, hold only a few of its slots, and the rest of that sender's
// sends are refused at once, nothing written (ErrDialogBusy for a member,
// ErrDialogNotFound for an outsider, as every send of theirs gets). Another
// member's send is still taken into the queue and written; each sender
// keeps at least two sends queued.
func TestOneSendersFloodLeavesTheDialogQueueToTheOthers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outsider bool
		refusal  error // the answer to a flooding send the queue refuses
		queued   error // the answer to a flooding send the queue held
	}{
		{name: "member", refusal: store.ErrDialogBusy},
		{name: "outsider", outsider: true, refusal: store.ErrDialogNotFound, queued: store.ErrDialogNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openStore(t)
			s.SetRequestTimeout(20 * time.Second) // the held lock must not end the queued sends
			f := newSendFixture(t, s, 3)
			flooder, member := f.users[1], f.users[2]
			if tc.outsider {
				flooder = newSendFixture(t, s, 2).users[1]
			}
			// A member's send waits for the held lock: the sends after it
			// wait in the queue (an outsider's alone would not wait for
			// the lock).
			release := holdDialog(t, f.dialog)
			lead := queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "lead"})
			n := store.DefaultSendQueue + 1
			held, outs := flood(t, s, f.dialog, flooder, n)
			if held < 2 || held >= store.DefaultSendQueue/4 {
				t.Errorf("one sender's %d concurrent sends hold %d of the dialog queue's %d slots, want 2..%d",
					n, held, store.DefaultSendQueue, store.DefaultSendQueue/4-1)
			}
			other := make(chan sendOutcome, 1)
			go func() {
				m, _, created, err := s.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog,
					SenderID: member, Body: "member", ClientMessageID: ids.New()})
				other <- sendOutcome{m, created, err}
			}()
			testenv.Eventually(t, 10*time.Second, func() bool {
				select {
				case o := <-other:
					t.Fatalf("a member's send into a queue one sender flooded: %v, want it queued", o.err)
				default:
				}
				return s.SendQueueDepth(f.dialog) == 1+held+1
			}, "the member's send never reached the queue")
			for range n - held {
				if o := <-outs; !errors.Is(o.err, tc.refusal) {
					t.Fatalf("a flooding send over the sender's share: %v, want %v", o.err, tc.refusal)
				}
			}
			release()
			o := <-lead
			if o.err != nil || !o.created || o.m.Seq != 1 {
				t.Fatalf("the lead send: seq %d created %v: %v", o.m.Seq, o.created, o.err)
			}
			written := []store.Message{o.m}
			for range held {
				o := <-outs
				switch {
				case tc.queued != nil && errors.Is(o.err, tc.queued):
				case tc.queued == nil && o.err == nil && o.created:
					written = append(written, o.m)
				default:
					t.Fatalf("a queued flooding send: created %v: %v, want %v", o.created, o.err, tc.queued)
				}
			}
			o = <-other
			if o.err != nil || !o.created {
				t.Fatalf("the member's queued send: created %v: %v", o.created, o.err)
			}
			written = append(written, o.m)
			// Only the queued sends were written, each once, gapless; the
			// member's arrived last.
			checkGapless(t, s, f.dialog, len(written), written)
			if o.m.Seq != int64(len(written)) {
				t.Fatalf("the member's send has seq %d, want %d (it arrived last)", o.m.Seq, len(written))
			}
		})
	}
}
