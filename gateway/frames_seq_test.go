package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// inboxFrame builds an internal-inbox event on a dialog channel as the
// inbox route does: the service's data object goes into data as it is,
// and the event has no seq of its own.
func inboxFrame(t *testing.T, dialogID, data string) []byte {
	t.Helper()
	b, err := pubsub.NewDialogEvent(ids.New(), "inbox.mirror", "ext-1", dialogID, 0, []byte(data)).Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A frame's seq is read from the frame's own fields, never from its data:
// an inbox event whose service-chosen data reads like a message.created
// event with a seq is no message (it was taken for message 3), and a
// message.created frame's seq is its own even when its message's body
// quotes another.
func TestCreatedSeqReadsTheFramesOwnFields(t *testing.T) {
	d := ids.New()
	if seq := createdSeq(inboxFrame(t, d, `{"source":"webhook","event":"message.created","seq":3}`)); seq != 0 {
		t.Fatalf("createdSeq of an inbox event whose data names a seq: %d, want 0", seq)
	}
	m := pubsub.Message{ID: ids.New(), DialogID: d, Seq: 7, SenderID: ids.New(), Body: `,"seq":1 "event":"x"`, Attachments: []pubsub.Attachment{}}
	b, err := pubsub.MessageCreated(ids.New(), m)
	if err != nil {
		t.Fatal(err)
	}
	if seq := createdSeq(b); seq != 7 {
		t.Fatalf("createdSeq of message 7's frame: %d", seq)
	}
}

type fixedRecovery struct{ res store.DialogRecovery }

func (f fixedRecovery) RecoverDialog(context.Context, string, int64, time.Duration, int, int) (store.DialogRecovery, error) {
	return f.res, nil
}

// What the misreading cost: a recovery read still serving later subscribes
// kept the inbox event as the dialog's message 3, and a subscriber joining
// it with sinceSeq=2 was told it had recovered up to 3, with the inbox
// frame in place of the real message 3, which it then dropped as replayed.
func TestAJoinedRecoveryTakesNoInboxEventForAMessage(t *testing.T) {
	cfg := Config{}
	cfg.defaults()
	cfg.RecoverLinger = time.Minute
	d := ids.New()
	ch := pubsub.DialogChannel(d)
	r := newRecoverer(&cfg, fixedRecovery{store.DialogRecovery{LastSeq: 2, Complete: true}})
	if _, err := r.recover("u", d, ch, 2); err != nil { // a first subscriber's read, which lingers
		t.Fatal(err)
	}
	b := inboxFrame(t, d, `{"source":"webhook","event":"message.created","seq":3}`)
	r.observe(ch, createdSeq(b), b) // as the hub's dispatch does
	rec, err := r.recover("u", d, ch, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rec.upTo >= 3 || len(rec.frames) > 0 {
		t.Fatalf("joined recovery up to %d with %d frames after an inbox event: message 3 would be dropped as replayed", rec.upTo, len(rec.frames))
	}
}
