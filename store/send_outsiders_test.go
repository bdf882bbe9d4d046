package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// sendHeld starts a send and waits until the dialog's queue holds it; a
// send answered instead (refused) fails the test with its answer.
func sendHeld(t *testing.T, s *store.Store, in store.SendMessage) <-chan sendOutcome {
	t.Helper()
	before := s.SendQueueDepth(in.DialogID)
	out := make(chan sendOutcome, 1)
	go func() {
		m, _, created, err := s.SendMessage(context.Background(), in)
		out <- sendOutcome{m, created, err}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		select {
		case o := <-out:
			t.Fatalf("%s's send into a dialog that outsiders flood: %v, want it queued", in.Body, o.err)
		default:
		}
		return s.SendQueueDepth(in.DialogID) == before+1
	}, "%s's send never reached the queue", in.Body)
	return out
}

// addMember makes user a member of dialog, as a membership written by
// another instance (or by hand) is: this store hears nothing of it. The
// dialog's row must not be locked.
func addMember(t *testing.T, pool *pgxpool.Pool, dialog, user string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO dialog_members(dialog_id, user_id, dialog_created_at)
		SELECT id, $2, created_at FROM dialogs WHERE id = $1`, dialog, user); err != nil {
		t.Fatal(err)
	}
}

// Senders who are no members of a dialog cannot take its queue from the
// members: however many outsiders send into it at once, each with a full
// share of concurrent sends, a member's send is still taken into the queue
// and written — one who sent before, one sending for the first time, and
// one who became a member only after an outsider's send of theirs was
// refused. Every outsider's send is answered ErrDialogNotFound, as an
// unknown dialog is, never ErrDialogBusy, and nothing of theirs is written.
func TestOutsidersCannotCrowdMembersOutOfTheDialogQueue(t *testing.T) {
	s, pool := openStore(t)
	s.SetRequestTimeout(30 * time.Second) // the held lock must not end the queued sends
	ctx := context.Background()
	f := newSendFixture(t, s, 3)
	veteran, newcomer := f.users[1], f.users[2]
	send := func(sender, body string) store.SendMessage {
		return store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: sender, Body: body, ClientMessageID: ids.New()}
	}
	// Enough outsiders, each with a full share of concurrent sends, to
	// fill the queue many times over, and one more who becomes a member
	// after a send of theirs was refused.
	flooders := 2 * store.DefaultSendQueue / store.SendShare
	outsiders := newSendFixture(t, s, flooders+2).users[1:]
	convert := outsiders[flooders]
	if _, _, _, err := s.SendMessage(ctx, send(convert, "outsider")); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("an outsider's send: %v, want ErrDialogNotFound", err)
	}
	addMember(t, pool, f.dialog, convert)
	// The veteran has sent into the dialog before.
	if _, _, _, err := s.SendMessage(ctx, send(veteran, "earlier")); err != nil {
		t.Fatal(err)
	}
	// A member's send waits for the held lock: the sends after it wait
	// in the queue behind it.
	release := holdDialog(t, f.dialog)
	lead := sendHeld(t, s, send(f.users[0], "lead"))
	var floods []chan sendOutcome
	for _, o := range outsiders[:flooders] {
		_, outs := flood(t, s, f.dialog, o, store.SendShare)
		floods = append(floods, outs)
	}
	// Another outsider's send is answered at once, as for an unknown
	// dialog.
	if _, _, _, err := s.SendMessage(ctx, send(outsiders[flooders-1], "late outsider")); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("an outsider's send into the flooded dialog: %v, want ErrDialogNotFound", err)
	}

	members := []<-chan sendOutcome{
		sendHeld(t, s, send(veteran, "veteran")),
		sendHeld(t, s, send(newcomer, "newcomer")),
		sendHeld(t, s, send(convert, "convert")),
	}
	release()
	written := []store.Message{}
	for i, out := range append([]<-chan sendOutcome{lead}, members...) {
		o := <-out
		if o.err != nil || !o.created {
			t.Fatalf("member send %d: created %v: %v", i, o.created, o.err)
		}
		written = append(written, o.m)
	}
	for i, outs := range floods {
		for range store.SendShare {
			if o := <-outs; !errors.Is(o.err, store.ErrDialogNotFound) {
				t.Fatalf("outsider %d's send: created %v: %v, want ErrDialogNotFound", i, o.created, o.err)
			}
		}
	}
	// The earlier message, then the lead's, then the members' in the
	// order they arrived; no outsider's.
	checkGapless(t, s, f.dialog, 1+len(written), written)
	for i, m := range written {
		if m.Seq != int64(i+2) {
			t.Fatalf("member send %d has seq %d, want %d", i, m.Seq, i+2)
		}
	}
}

// The instance remembers only the members a send proved, for as long as
// they are members: an outsider's refused sends leave nothing behind in its
// memory (a million accounts sending into dialogs they are no members of
// grow no table there), and a member whose membership ended is forgotten
// at their next send, which is answered ErrDialogNotFound.
func TestTheSendQueueRemembersOnlyMembers(t *testing.T) {
	s, pool := openStore(t)
	f := newSendFixture(t, s, 2)
	outsiders := newSendFixture(t, s, 21).users[1:]
	ctx := context.Background()
	for _, u := range f.users {
		if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: u, Body: "member"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.KnownSenders(); n != 2 {
		t.Fatalf("the instance remembers %d senders after two members' sends, want 2", n)
	}
	for i, o := range outsiders {
		if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: o,
			Body: fmt.Sprintf("outsider %d", i)}); !errors.Is(err, store.ErrDialogNotFound) {
			t.Fatalf("outsider's send: %v, want ErrDialogNotFound", err)
		}
	}
	if n := s.KnownSenders(); n != 2 {
		t.Fatalf("the instance remembers %d senders after %d outsiders' sends, want 2", n, len(outsiders))
	}
	if _, err := pool.Exec(ctx, "DELETE FROM dialog_members WHERE dialog_id=$1 AND user_id=$2", f.dialog, f.users[1]); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "former"}); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("a former member's send: %v, want ErrDialogNotFound", err)
	}
	if n := s.KnownSenders(); n != 1 {
		t.Fatalf("the instance remembers %d senders after one of the two members left, want 1", n)
	}
	checkGapless(t, s, f.dialog, 2, nil)
}
