package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// slowBody makes the messages table's insert of a message with that body
// sleep for a minute (a trigger, dropped at the test's end): a send
// statement that stalls for no lock.
func slowBody(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	body := "slow " + ids.New()
	for _, q := range []string{
		`CREATE OR REPLACE FUNCTION test_slow_send() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$`,
		`CREATE TRIGGER test_slow_send BEFORE INSERT ON messages FOR EACH ROW
			WHEN (NEW.body = '` + body + `') EXECUTE FUNCTION test_slow_send()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, env.DatabaseURL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP TRIGGER test_slow_send ON messages; DROP FUNCTION test_slow_send()"); err != nil {
			t.Error(err)
		}
	})
	return body
}

// dialogLockFree reports whether the dialog's row lock can be taken at once.
func dialogLockFree(t *testing.T, dialog string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id=$1 FOR UPDATE NOWAIT", dialog)
	return err == nil
}

// A send statement that runs past its send's budget, for no lock, is cut
// short by PostgreSQL at that budget: the send is answered ErrDatabaseBusy
// (nothing written, known at once), the dialog's row lock is free again by
// then, and the next send into the dialog is written. Without that bound
// the client gave up only one request budget later and answered the send as
// of unknown outcome, with the statement still running and the dialog
// locked. A send of another dialog that shared the slow statement is
// written again with its own budget.
func TestASlowSendStatementIsCutShortAtItsBudget(t *testing.T) {
	for _, c := range []struct {
		name  string
		group bool
	}{{"in a group", true}, {"alone", false}} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := openStore(t)
			s.SetRequestTimeout(10 * time.Second)
			s.SetSendLinger(0)
			f := newSendFixture(t, s, 2)
			slow := slowBody(t)
			budget, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			in := store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: slow}
			if !c.group {
				m, _, created, err := s.SendMessage(budget, in)
				checkSlowSend(t, s, f, sendOutcome{m, created, err})
				return
			}
			other := newSendFixture(t, s, 2)
			release, first := occupy(t, s)
			slowOut := queueSend(t, s, budget, in)
			otherOut := queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: other.dialog,
				SenderID: other.users[0], Body: "beside"})
			waitGroupWaiting(t, s, 2)
			release() // one statement writes both batches
			if o := <-first; o.err != nil {
				t.Fatalf("the send that held the committer: %v", o.err)
			}
			checkSlowSend(t, s, f, <-slowOut)
			if o := <-otherOut; o.err != nil || !o.created || o.m.Seq != 1 {
				t.Fatalf("the send that shared the slow statement: created %v: %v", o.created, o.err)
			}
		})
	}
}

func checkSlowSend(t *testing.T, s *store.Store, f sendFixture, o sendOutcome) {
	t.Helper()
	if !errors.Is(o.err, store.ErrDatabaseBusy) || o.created {
		t.Fatalf("a send whose statement ran past its budget: created %v: %v, want ErrDatabaseBusy", o.created, o.err)
	}
	if !dialogLockFree(t, f.dialog) {
		t.Fatal("the dialog's row lock is still held once its slow send was answered")
	}
	checkEmpty(t, s, f.dialog)
	m, _, created, err := s.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "next"})
	if err != nil || !created || m.Seq != 1 {
		t.Fatalf("the next send into the dialog: created %v seq %d: %v", created, m.Seq, err)
	}
}

// When a dialog's batch waits for the dialog's row lock longer than the
// earliest budget among its sends, that send is answered database_busy
// unwritten, and the others keep waiting within their own budgets: once the
// lock is free, they are written.
func TestABatchOnAHeldLockKeepsEachSendsOwnBudget(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	f := newSendFixture(t, s, 2)
	releaseLocked := holdDialog(t, f.dialog)
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	head := queueSend(t, s, short, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "short budget"})
	waitGroupWaiting(t, s, 1)
	joined := queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "long budget"})
	release() // the batch of both goes to the locked dialog
	<-first
	if o := <-head; !errors.Is(o.err, store.ErrDatabaseBusy) || o.created {
		t.Fatalf("send whose budget ran out on the held lock: created %v: %v", o.created, o.err)
	}
	select {
	case o := <-joined:
		t.Fatalf("the send with most of its budget left was answered with the one whose budget ran out: created %v: %v", o.created, o.err)
	default:
	}
	releaseLocked()
	o := <-joined
	if o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send with most of its budget left, the lock free within it: created %v seq %d: %v", o.created, o.m.Seq, o.err)
	}
	checkGapless(t, s, f.dialog, 1, []store.Message{o.m})
}
