package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// Every path that reads a message gives the same Message, with every field
// filled: the send's answer, the answer to a repeated clientMessageId, one
// message by id, the history, and the dialog listing's last message. The
// frames built from it — the send's, the outbox relay's and the socket
// recovery's — are one and the same. Each path has its own column list and
// scan (and the send reads the send_groups function's rows), so a field
// added to Message that one of them does not read is zero there, and this
// test names the path.
func TestEveryMessageReadGivesTheSameMessage(t *testing.T) {
	s, _ := openStore(t)
	f := newSendFixture(t, s, 2)
	ctx := context.Background()
	in := store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "every field",
		ClientMessageID: "cmid-" + ids.New(), AttachmentIDs: []string{uploadedAttachment(t, s, f.dialog, f.users[1])}, Event: true}
	sent, ev, created, err := s.SendMessage(ctx, in)
	if err != nil || !created {
		t.Fatalf("send: created %v: %v", created, err)
	}
	want, err := s.GetMessage(ctx, sent.ID)
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(want)
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			t.Errorf("GetMessage left Message.%s zero: set it in this test's send", v.Type().Field(i).Name)
		}
	}
	repeat := in
	repeat.ID = ids.New()
	dup, _, created, err := s.SendMessage(ctx, repeat)
	if err != nil || created {
		t.Fatalf("repeated clientMessageId: created %v: %v", created, err)
	}
	history, _, err := s.ListMessages(ctx, f.dialog, 0, 10)
	if err != nil || len(history) != 1 {
		t.Fatalf("history %d messages: %v", len(history), err)
	}
	dialogs, _, err := s.ListDialogs(ctx, f.users[1], "", 10)
	if err != nil || len(dialogs) != 1 || dialogs[0].LastMessage == nil {
		t.Fatalf("listing %+v: %v", dialogs, err)
	}
	for path, got := range map[string]store.Message{"send": sent, "repeated send": dup, "history": history[0],
		"listing's last message": *dialogs[0].LastMessage} {
		if !sameMessage(got, want) {
			t.Errorf("%s read\n%+v\nGetMessage read\n%+v", path, got, want)
		}
	}

	frame, err := pubsub.MessageCreated(ev.EventID, want.Wire())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.RecoverDialog(ctx, f.dialog, 0, time.Hour, 10, 1<<20)
	if err != nil || len(rec.Events) != 1 {
		t.Fatalf("recovery %+v: %v", rec, err)
	}
	relayed := relayFrame(t, s, ev.EventID)
	for path, got := range map[string][]byte{"send": ev.Payload, "recovery": rec.Events[0].Frame, "relay": relayed} {
		if string(got) != string(frame) {
			t.Errorf("%s frame\n%s\nframe of the message GetMessage read\n%s", path, got, frame)
		}
	}
}

// sameMessage compares two reads of a message; times by instant, since
// each read may carry another location.
func sameMessage(a, b store.Message) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return false
	}
	a.CreatedAt, b.CreatedAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// relayFrame is the frame the outbox relay builds for the event.
func relayFrame(t *testing.T, s *store.Store, eventID string) []byte {
	t.Helper()
	for i := 0; i < 100; i++ {
		var frame []byte
		if _, err := s.RelayOutbox(context.Background(), 0, 1000, func(_ context.Context, row pubsub.OutboxRow) error {
			if row.EventID == eventID {
				frame = row.Payload
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if frame != nil {
			return frame
		}
	}
	t.Fatal("the relay never claimed the event")
	return nil
}
