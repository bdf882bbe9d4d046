package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// waitGroupWaiting waits until n dialogs' batches wait for a send
// transaction.
func waitGroupWaiting(t *testing.T, s *store.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.SendGroupWaiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches wait for a send transaction, want %d", s.SendGroupWaiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// transactionsOf counts the distinct transactions that wrote the messages.
func transactionsOf(t *testing.T, msgs ...store.Message) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	idList := make([]string, len(msgs))
	for i, m := range msgs {
		idList[i] = m.ID
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(DISTINCT xmin::text) FROM messages WHERE id = ANY($1::text[]::uuid[])", idList).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// occupy makes the store's only send transaction wait for a held dialog
// lock (for up to a quarter of the request budget); the returned release
// lets it finish, and done reports its send.
func occupy(t *testing.T, s *store.Store) (release func(), done <-chan sendOutcome) {
	t.Helper()
	s.HoldCommitterOnLocks()
	f := newSendFixture(t, s, 2)
	release = holdDialog(t, f.dialog)
	done = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "first"})
	return release, done
}

// sendIntoNewDialogs queues one send with body into each of n new dialogs
// of two users.
func sendIntoNewDialogs(t *testing.T, s *store.Store, n int, body string) ([]sendFixture, []<-chan sendOutcome) {
	t.Helper()
	fixtures := make([]sendFixture, n)
	outs := make([]<-chan sendOutcome, n)
	for i := range fixtures {
		fixtures[i] = newSendFixture(t, s, 2)
		outs[i] = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: fixtures[i].dialog,
			SenderID: fixtures[i].users[1], Body: body})
	}
	return fixtures, outs
}

// With every send transaction busy, batches of different dialogs that wait
// together are written in one transaction, each with its own gapless seq
// and its own answer.
func TestSendsIntoDialogsReadyTogetherShareOneTransaction(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	fixtures, outs := sendIntoNewDialogs(t, s, 5, "grouped")
	waitGroupWaiting(t, s, len(fixtures))
	release()
	if o := <-first; o.err != nil || !o.created {
		t.Fatalf("the send that held the transaction: %v", o.err)
	}
	var msgs []store.Message
	for i, ch := range outs {
		o := <-ch
		if o.err != nil || !o.created || o.m.Seq != 1 || o.m.DialogID != fixtures[i].dialog || o.m.Body != "grouped" {
			t.Fatalf("grouped send %d: %+v created %v: %v", i, o.m, o.created, o.err)
		}
		checkGapless(t, s, fixtures[i].dialog, 1, []store.Message{o.m})
		msgs = append(msgs, o.m)
	}
	if n := transactionsOf(t, msgs...); n != 1 {
		t.Fatalf("the five waiting sends were written by %d transactions, want one", n)
	}
}

// When a group's transaction fails, nothing of it is kept and each dialog's
// batch is written on its own: a value PostgreSQL refuses fails only its
// send, and a dialog whose lock is held elsewhere delays only itself.
func TestAFailedGroupFailsOnlyItsBadDialog(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(8 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	ctx := context.Background()
	good, outs := sendIntoNewDialogs(t, s, 3, "fine")
	bad := newSendFixture(t, s, 2)
	nul := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: bad.dialog, SenderID: bad.users[0], Body: "nul \x00 byte"})
	locked := newSendFixture(t, s, 2)
	releaseLocked := holdDialog(t, locked.dialog)
	late := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: locked.dialog, SenderID: locked.users[0], Body: "late"})
	waitGroupWaiting(t, s, len(good)+2)
	release()
	<-first
	for i, ch := range outs {
		select {
		case o := <-ch:
			if o.err != nil || !o.created || o.m.Seq != 1 {
				t.Fatalf("good send %d beside a failing group: created %v: %v", i, o.created, o.err)
			}
			checkGapless(t, s, good[i].dialog, 1, []store.Message{o.m})
		case <-time.After(6 * time.Second):
			t.Fatalf("good send %d still waits while another dialog's lock is held", i)
		}
	}
	if o := <-nul; o.err == nil || o.created {
		t.Fatalf("NUL body: created %v: %v", o.created, o.err)
	}
	checkEmpty(t, s, bad.dialog)
	releaseLocked()
	if o := <-late; o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send into the dialog that was locked: created %v: %v", o.created, o.err)
	}
	checkGapless(t, s, locked.dialog, 1, nil)
}

// A batch whose budget runs out while it waits for a send transaction is
// answered database_busy unwritten, and the batches waiting with it are
// written with their own budgets.
func TestAnExpiredBatchLeavesItsGroup(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	a, b := newSendFixture(t, s, 2), newSendFixture(t, s, 2)
	expired := queueSend(t, s, short, store.SendMessage{ID: ids.New(), DialogID: a.dialog, SenderID: a.users[0], Body: "short budget"})
	kept := queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: b.dialog, SenderID: b.users[0], Body: "long budget"})
	waitGroupWaiting(t, s, 2)
	<-short.Done()
	time.Sleep(50 * time.Millisecond)
	release()
	<-first
	if o := <-expired; !errors.Is(o.err, store.ErrDatabaseBusy) || o.created {
		t.Fatalf("send past its budget: created %v: %v", o.created, o.err)
	}
	checkEmpty(t, s, a.dialog)
	if o := <-kept; o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send waiting beside an expired one: created %v: %v", o.created, o.err)
	}
}

// A send that joined its dialog's batch while the batch waited for a send
// transaction keeps its own budget: the send ahead of it, whose budget ran
// out meanwhile, is answered database_busy unwritten, alone.
func TestASendThatJoinedAnExpiredOneIsWrittenWithItsOwnBudget(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	f := newSendFixture(t, s, 2)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	head := queueSend(t, s, short, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "short budget"})
	waitGroupWaiting(t, s, 1)
	joined := queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "long budget"})
	<-short.Done()
	time.Sleep(50 * time.Millisecond)
	release()
	<-first
	if o := <-head; !errors.Is(o.err, store.ErrDatabaseBusy) || o.created {
		t.Fatalf("send past its budget: created %v: %v", o.created, o.err)
	}
	o := <-joined
	if o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send that joined it with most of its budget left: created %v seq %d: %v", o.created, o.m.Seq, o.err)
	}
	checkGapless(t, s, f.dialog, 1, []store.Message{o.m})
}

// While the pool has no connection free, a group waits for one as long as
// the longest budget among its sends: a send grouped with one whose budget
// is short is written once a connection comes free within its own budget,
// and the short one, expired by then, is answered database_busy unwritten.
func TestAGroupWaitingForAConnectionKeepsEachSendsOwnBudget(t *testing.T) {
	openStore(t) // applies the migrations
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := store.New(pool)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(300 * time.Millisecond)
	a, b := newSendFixture(t, s, 2), newSendFixture(t, s, 2)
	held, err := pool.Acquire(ctx) // other requests hold the only connection
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancel()
	expired := queueSend(t, s, short, store.SendMessage{ID: ids.New(), DialogID: a.dialog, SenderID: a.users[0], Body: "short budget"})
	kept := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: b.dialog, SenderID: b.users[0], Body: "long budget"})
	waitGroupWaiting(t, s, 1) // the second batch lingers with the first: one group
	<-short.Done()
	time.Sleep(300 * time.Millisecond)
	held.Release()
	if o := <-expired; !errors.Is(o.err, store.ErrDatabaseBusy) || o.created {
		t.Fatalf("send past its budget: created %v: %v", o.created, o.err)
	}
	if o := <-kept; o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send grouped with a shorter budget, a connection free within its own: created %v: %v", o.created, o.err)
	}
	checkEmpty(t, s, a.dialog)
}

// With one send transaction, a send into a dialog whose row lock is held
// elsewhere gives the transaction up after a short lock wait and waits on
// its own, so sends into other dialogs go on; it is written once the lock
// is free, within its budget.
func TestADialogLockedElsewhereDoesNotStallOtherSends(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	ctx := context.Background()
	locked, free := newSendFixture(t, s, 2), newSendFixture(t, s, 2)
	releaseLocked := holdDialog(t, locked.dialog)
	late := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: locked.dialog, SenderID: locked.users[0], Body: "late"})
	for i := range 3 {
		done := make(chan sendOutcome, 1)
		go func() {
			m, _, created, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: free.dialog, SenderID: free.users[1], Body: "goes on"})
			done <- sendOutcome{m, created, err}
		}()
		select {
		case o := <-done:
			if o.err != nil || !o.created || o.m.Seq != int64(i+1) {
				t.Fatalf("send %d beside a locked dialog: created %v seq %d: %v", i, o.created, o.m.Seq, o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("send %d into a free dialog waits while another dialog is locked", i)
		}
	}
	select {
	case o := <-late:
		t.Fatalf("the send into the locked dialog was answered while the lock was held: %v", o.err)
	default:
	}
	releaseLocked()
	if o := <-late; o.err != nil || !o.created || o.m.Seq != 1 {
		t.Fatalf("send into the dialog once unlocked: created %v: %v", o.created, o.err)
	}
	checkGapless(t, s, free.dialog, 3, nil)
}

func checkEmpty(t *testing.T, s *store.Store, dialog string) {
	t.Helper()
	page, _, err := s.ListMessages(context.Background(), dialog, 0, 10)
	if err != nil || len(page) != 0 {
		t.Fatalf("dialog holds %d messages (%v), want none", len(page), err)
	}
}

// Two instances with two send transactions each, sending into eight
// dialogs at once: the groups take dialog locks in one order, so nothing
// deadlocks, and every dialog stays gapless with each sender in order.
func TestGroupsOfTwoInstancesOverManyDialogs(t *testing.T) {
	s1, _ := openStore(t)
	s2, _ := openStore(t)
	for _, s := range []*store.Store{s1, s2} {
		s.SetSendCommitters(2)
		s.SetRequestTimeout(10 * time.Second)
	}
	fixtures := make([]sendFixture, 8)
	for i := range fixtures {
		fixtures[i] = newSendFixture(t, s1, 12)
	}
	type sent struct {
		dialog int
		m      [2]store.Message
		err    error
	}
	out := make(chan sent, 12*len(fixtures))
	for d, f := range fixtures {
		for u, user := range f.users {
			go func() {
				st := []*store.Store{s1, s2}[(d+u)%2]
				r := sent{dialog: d}
				for k := range r.m {
					m, _, created, err := st.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog,
						SenderID: user, Body: "in order", ClientMessageID: ids.New(), Event: true})
					if err == nil && !created {
						err = errors.New("not created")
					}
					if err != nil {
						r.err = err
						break
					}
					r.m[k] = m
				}
				out <- r
			}()
		}
	}
	answered := make([][]store.Message, len(fixtures))
	for range 12 * len(fixtures) {
		r := <-out
		if r.err != nil {
			t.Fatalf("send into dialog %d: %v", r.dialog, r.err)
		}
		if r.m[1].Seq <= r.m[0].Seq {
			t.Fatalf("a sender's second message has seq %d, its first %d", r.m[1].Seq, r.m[0].Seq)
		}
		answered[r.dialog] = append(answered[r.dialog], r.m[0], r.m[1])
	}
	for i, f := range fixtures {
		checkGapless(t, s1, f.dialog, 24, answered[i])
	}
}

// With a linger, a batch that finds the send transaction free waits for
// the batches of other dialogs: sends that arrive within it are written in
// its transaction, each with its own seq and answer.
func TestSendsArrivingWithinTheLingerShareOneTransaction(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(500 * time.Millisecond)
	fixtures := make([]sendFixture, 4)
	for i := range fixtures {
		fixtures[i] = newSendFixture(t, s, 2)
	}
	before := s.SendStats()
	start := time.Now()
	outs := make([]<-chan sendOutcome, len(fixtures))
	for i, f := range fixtures {
		outs[i] = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "company"})
	}
	var msgs []store.Message
	for i, ch := range outs {
		o := <-ch
		if o.err != nil || !o.created || o.m.Seq != 1 || o.m.DialogID != fixtures[i].dialog || o.m.SenderID != fixtures[i].users[0] {
			t.Fatalf("send %d: %+v created %v: %v", i, o.m, o.created, o.err)
		}
		msgs = append(msgs, o.m)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Fatalf("the first send was answered after %v, before its linger ended", waited)
	}
	if n := transactionsOf(t, msgs...); n != 1 {
		t.Fatalf("four sends within the linger were written by %d transactions, want one", n)
	}
	after := s.SendStats()
	if tx, sends := after.Transactions-before.Transactions, after.Sends-before.Sends; tx != 1 || sends != 4 {
		t.Fatalf("SendStats counted %d transactions carrying %d sends, want 1 and 4", tx, sends)
	}
}

// A lingering transaction leaves as soon as the batches that joined it fill
// a group (32 dialogs), however long the linger.
func TestALingeringTransactionLeavesWhenItsGroupIsFull(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(30 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(time.Hour)
	fixtures := make([]sendFixture, 32)
	for i := range fixtures {
		fixtures[i] = newSendFixture(t, s, 2)
	}
	outs := make([]<-chan sendOutcome, len(fixtures))
	for i, f := range fixtures {
		outs[i] = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "full"})
	}
	var msgs []store.Message
	timeout := time.After(20 * time.Second)
	for i, ch := range outs {
		select {
		case o := <-ch:
			if o.err != nil || !o.created || o.m.Seq != 1 {
				t.Fatalf("send %d: %+v created %v: %v", i, o.m, o.created, o.err)
			}
			msgs = append(msgs, o.m)
		case <-timeout:
			t.Fatalf("a full group kept lingering: %d of 32 sends answered", i)
		}
	}
	if n := transactionsOf(t, msgs...); n != 1 {
		t.Fatalf("32 sends were written by %d transactions, want one", n)
	}
}

// Sends into the same dialog that queue behind a batch while it waits for
// company join it: one transaction, seqs in arrival order.
func TestSendsQueuedBehindALingeringBatchJoinIt(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(500 * time.Millisecond)
	f := newSendFixture(t, s, 3)
	before := s.SendStats()
	outs := make([]<-chan sendOutcome, 4)
	for i := range outs {
		outs[i] = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog,
			SenderID: f.users[i%3], Body: "behind " + string(rune('a'+i))})
	}
	var msgs []store.Message
	for i, ch := range outs {
		o := <-ch
		if o.err != nil || !o.created || o.m.Seq != int64(i+1) || o.m.Body != "behind "+string(rune('a'+i)) || o.m.SenderID != f.users[i%3] {
			t.Fatalf("send %d: %+v created %v: %v", i, o.m, o.created, o.err)
		}
		msgs = append(msgs, o.m)
	}
	checkGapless(t, s, f.dialog, 4, msgs)
	if n := transactionsOf(t, msgs...); n != 1 {
		t.Fatalf("four sends into one dialog within the linger were written by %d transactions, want one", n)
	}
	if st := s.SendStats(); st.Transactions-before.Transactions != 1 || st.Batches-before.Batches != 1 {
		t.Fatalf("SendStats: %d transactions, %d batches, want 1 and 1", st.Transactions-before.Transactions, st.Batches-before.Batches)
	}
}

// One group statement carries several dialogs' batches with every outcome
// a batch can hold: each dialog gets its own gapless seqs in arrival order,
// a clientMessageId repeated within a dialog answers the first message
// while the same id in another dialog is a message of its own, a sender who
// is not a member of the dialog is refused without taking a seq, and every
// created message is written by the one transaction.
func TestOneGroupStatementAnswersEachDialogAndMessage(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendCommitters(1)
	s.SetSendLinger(0)
	release, first := occupy(t, s)
	a, b, c := newSendFixture(t, s, 2), newSendFixture(t, s, 2), newSendFixture(t, s, 2)
	type sent struct {
		in  store.SendMessage
		out <-chan sendOutcome
	}
	var all []sent
	send := func(dialog, sender, body, cmid string) int {
		in := store.SendMessage{ID: ids.New(), DialogID: dialog, SenderID: sender, Body: body, ClientMessageID: cmid}
		all = append(all, sent{in, queueSend(t, s, context.Background(), in)})
		return len(all) - 1
	}
	a1 := send(a.dialog, a.users[0], "a1", "same")
	a2 := send(a.dialog, a.users[1], "a2", "")
	aDup := send(a.dialog, a.users[0], "a1 again", "same")
	bOut := send(b.dialog, a.users[0], "not a member of b", "")
	b1 := send(b.dialog, b.users[0], "b1", "same")
	b2 := send(b.dialog, b.users[1], "b2", "")
	c1 := send(c.dialog, c.users[1], "c1", "")
	waitGroupWaiting(t, s, 3)
	release()
	if o := <-first; o.err != nil || !o.created {
		t.Fatalf("the send that held the transaction: %v", o.err)
	}
	got := make([]sendOutcome, len(all))
	for i, x := range all {
		got[i] = <-x.out
	}
	want := map[int]int64{a1: 1, a2: 2, b1: 1, b2: 2, c1: 1}
	var created []store.Message
	for i, seq := range want {
		o, in := got[i], all[i].in
		if o.err != nil || !o.created || o.m.Seq != seq || o.m.ID != in.ID || o.m.DialogID != in.DialogID ||
			o.m.SenderID != in.SenderID || o.m.Body != in.Body || o.m.ClientMessageID != in.ClientMessageID {
			t.Fatalf("send %q: %+v created %v: %v, want seq %d", in.Body, o.m, o.created, o.err, seq)
		}
		created = append(created, o.m)
	}
	if o := got[aDup]; o.err != nil || o.created || o.m.ID != got[a1].m.ID || o.m.Seq != 1 || o.m.Body != "a1" {
		t.Fatalf("the repeated clientMessageId: %+v created %v: %v, want the first message", o.m, o.created, o.err)
	}
	if o := got[bOut]; !errors.Is(o.err, store.ErrDialogNotFound) {
		t.Fatalf("a non-member's send: %+v created %v: %v, want ErrDialogNotFound", o.m, o.created, o.err)
	}
	checkGapless(t, s, a.dialog, 2, []store.Message{got[a1].m, got[a2].m})
	checkGapless(t, s, b.dialog, 2, []store.Message{got[b1].m, got[b2].m})
	checkGapless(t, s, c.dialog, 1, []store.Message{got[c1].m})
	if n := transactionsOf(t, created...); n != 1 {
		t.Fatalf("the group's messages were written by %d transactions, want one", n)
	}
}

// sendSQL runs a send statement (send_groups or send_messages) directly
// and returns its answers as "ord:outcome:seq", in ord order.
func sendSQL(t *testing.T, pool *pgxpool.Pool, query string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT r_ord, r_outcome, r_seq FROM "+query+" ORDER BY r_ord", args...)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var ord int32
		var outcome string
		var seq int64
		if err := rows.Scan(&ord, &outcome, &seq); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%s:%d", ord, outcome, seq))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, " ")
}

// send_groups treats a dialog listed twice as one dialog: its seqs continue
// across both listings, and last_seq ends at the last of them.
func TestSendGroupsDialogListedTwice(t *testing.T) {
	s, pool := openStore(t)
	f := newSendFixture(t, s, 2)
	got := sendSQL(t, pool, `send_groups($1::text[]::uuid[], $2::text[], 1000, $3::int[],
		$4::text[]::uuid[], $5::text[]::uuid[], $6::text[], $7::text[], $8::int[], '{}'::uuid[], $7::text[], $9::boolean[],
		$7::text[], $7::text[], $7::text[], $8::int[], $10::text[], $11::bigint[])`,
		[]string{f.dialog, f.dialog}, []string{"c", "c"}, []int32{1, 2, 1}, []string{ids.New(), ids.New(), ids.New()},
		[]string{f.users[0], f.users[1], f.users[0]}, []string{"one", "two", "three"}, []string{"", "", ""},
		[]int32{0, 0, 0}, []bool{false, false, false}, []string{"{}", "{}", "{}"}, []int64{0, 0, 0})
	if got != "1:created:1 2:created:2 3:created:3" {
		t.Fatalf("send_groups answered %q, want seqs 1 2 3 in array order", got)
	}
	checkGapless(t, s, f.dialog, 3, nil)
}

// send_messages, the statement of the previous release (still called by
// its instances during a rolling upgrade), writes through send_groups: the
// same outcomes and seqs.
func TestSendMessagesOfThePreviousReleaseStillWrites(t *testing.T) {
	s, pool := openStore(t)
	f := newSendFixture(t, s, 2)
	got := sendSQL(t, pool, `send_messages($1::uuid, 'c', 1000,
		$2::text[]::uuid[], $3::text[]::uuid[], $4::text[], $5::text[], $6::int[], '{}'::uuid[], $5::text[], $7::boolean[],
		$5::text[], $5::text[], $5::text[], $6::int[], $8::text[], $9::bigint[])`,
		f.dialog, []string{ids.New(), ids.New()}, []string{f.users[1], ids.New()}, []string{"member", "stranger"},
		[]string{"", ""}, []int32{0, 0}, []bool{false, false}, []string{"{}", "{}"}, []int64{0, 0})
	if got != "1:created:1 2:not_member:0" {
		t.Fatalf("send_messages answered %q, want 1:created:1 2:not_member:0", got)
	}
	checkGapless(t, s, f.dialog, 1, nil)
}

// A lone send's wait for company never takes its whole budget: with a
// linger as long as the request budget, a send that finds the send
// transaction free waited the full linger and then had no time left for
// its statement, and every send at a moderate rate answered
// database_busy. The wait is at most a quarter of what is left of the
// batch's budget.
func TestALingerAsLongAsTheBudgetStillWritesALoneSend(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(400 * time.Millisecond)
	s.SetSendCommitters(1)
	s.SetSendLinger(400 * time.Millisecond)
	f := newSendFixture(t, s, 2)
	for i := range 3 {
		o := <-queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "alone"})
		if o.err != nil || !o.created || o.m.Seq != int64(i+1) {
			t.Fatalf("lone send %d with a linger as long as its budget: %+v created %v: %v", i, o.m, o.created, o.err)
		}
	}
}
