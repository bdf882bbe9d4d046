package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A send over its dialog's queue bound is answered for a member only: a
// member's is refused with ErrDialogBusy, while a sender who is no member of
// the dialog gets ErrDialogNotFound, the answer every other send of theirs
// and a send into an unknown dialog get, so how busy a dialog is tells an
// outsider nothing (not even that it exists). Nothing of either is written.
func TestAnOutsidersSendOverTheDialogQueueIsAnsweredAsAnUnknownDialog(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second) // the held lock must not end the queued send
	s.SetSendQueue(1)
	f := newSendFixture(t, s, 2)
	outsider := newSendFixture(t, s, 2).users[1]
	release := holdDialog(t, f.dialog)
	ctx := context.Background()
	queued := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "queued"})
	member, stranger := ids.New(), ids.New()
	if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: stranger, DialogID: f.dialog, SenderID: outsider, Body: "x"}); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("an outsider's send into a full dialog queue: %v, want ErrDialogNotFound", err)
	}
	if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: member, DialogID: f.dialog, SenderID: f.users[1], Body: "x"}); !errors.Is(err, store.ErrDialogBusy) {
		t.Fatalf("a member's send into a full dialog queue: %v, want ErrDialogBusy", err)
	}
	release()
	if o := <-queued; o.err != nil || !o.created {
		t.Fatalf("queued send: %v", o.err)
	}
	for _, id := range []string{member, stranger} {
		if _, err := s.GetMessage(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("refused send was written: %v", err)
		}
	}
	checkGapless(t, s, f.dialog, 1, nil)
}
