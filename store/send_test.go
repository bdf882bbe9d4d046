package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// sendFixture is a dialog of n users (users[0] created it).
type sendFixture struct {
	users  []string
	dialog string
}

func newSendFixture(t *testing.T, s *store.Store, n int) sendFixture {
	t.Helper()
	ctx := context.Background()
	f := sendFixture{users: make([]string, n)}
	for i := range f.users {
		f.users[i] = ids.New()
		if err := s.EnsureUser(ctx, f.users[i]); err != nil {
			t.Fatal(err)
		}
	}
	d, err := s.CreateDialog(ctx, ids.New(), f.users[0], "send", f.users[1:])
	if err != nil {
		t.Fatal(err)
	}
	f.dialog = d.ID
	return f
}

// checkGapless asserts that the dialog holds exactly seqs 1..n, that
// dialogs.last_seq is n, and that every answered message is the stored row.
func checkGapless(t *testing.T, s *store.Store, dialog string, n int, answered []store.Message) {
	t.Helper()
	ctx := context.Background()
	var stored []store.Message
	for after := int64(0); ; {
		page, more, err := s.ListMessages(ctx, dialog, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, page...)
		if !more {
			break
		}
		after = page[len(page)-1].Seq
	}
	if len(stored) != n {
		t.Fatalf("%d messages stored, want %d", len(stored), n)
	}
	byID := map[string]store.Message{}
	for i, m := range stored {
		if m.Seq != int64(i+1) {
			t.Fatalf("message %d has seq %d: not gapless", i+1, m.Seq)
		}
		byID[m.ID] = m
	}
	for _, a := range answered {
		m, ok := byID[a.ID]
		if !ok || m.Seq != a.Seq || m.Body != a.Body || m.SenderID != a.SenderID || !m.CreatedAt.Equal(a.CreatedAt) {
			t.Fatalf("answer %+v does not match the stored row %+v", a, m)
		}
	}
	d, err := s.DialogForMember(ctx, dialog, stored[0].SenderID)
	if err != nil || d.LastSeq != int64(n) {
		t.Fatalf("last_seq %d, want %d (%v)", d.LastSeq, n, err)
	}
}

// sendTwice has each user send two messages, one after the other, all
// users at once, through the stores in turn; it returns every answer.
func sendTwice(t *testing.T, stores []*store.Store, f sendFixture) (first, second map[string]store.Message) {
	t.Helper()
	first, second = map[string]store.Message{}, map[string]store.Message{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, len(f.users))
	for i, u := range f.users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%len(stores)]
			var got [2]store.Message
			for k := range got {
				m, _, created, err := s.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog,
					SenderID: u, Body: fmt.Sprintf("%s #%d", u, k), ClientMessageID: ids.New(), Event: true})
				if err != nil || !created {
					errs <- fmt.Errorf("send %d of %s: created %v: %w", k, u, created, err)
					return
				}
				got[k] = m
			}
			mu.Lock()
			first[u], second[u] = got[0], got[1]
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, u := range f.users {
		if second[u].Seq <= first[u].Seq {
			t.Fatalf("sender %s: second send seq %d not after first %d", u, second[u].Seq, first[u].Seq)
		}
	}
	return first, second
}

func answers(ms ...map[string]store.Message) []store.Message {
	var out []store.Message
	for _, m := range ms {
		for _, v := range m {
			out = append(out, v)
		}
	}
	return out
}

// 100 members send two messages each into one dialog at once: seqs 1..200
// without a gap, each sender's second message after its first, each answer
// the stored row.
func TestConcurrentSendsIntoOneDialogAreGapless(t *testing.T) {
	s, _ := openStore(t)
	f := newSendFixture(t, s, 100)
	first, second := sendTwice(t, []*store.Store{s}, f)
	checkGapless(t, s, f.dialog, 200, answers(first, second))
}

// Two instances (two stores, two pools) sending into one dialog at once
// still give gapless seqs: the dialog's row lock orders their batches.
func TestSendsFromTwoInstancesAreGapless(t *testing.T) {
	s1, _ := openStore(t)
	s2, _ := openStore(t)
	f := newSendFixture(t, s1, 60)
	first, second := sendTwice(t, []*store.Store{s1, s2}, f)
	checkGapless(t, s1, f.dialog, 120, answers(first, second))
}

// holdDialog takes the dialog's row lock on its own connection until the
// returned release is called, so sends into it queue up.
func holdDialog(t *testing.T, dialog string) (release func()) {
	t.Helper()
	release, _ = holdDialogPID(t, dialog)
	return release
}

// holdDialogPID is holdDialog that also names the PostgreSQL backend holding
// the lock (for waitBlocked).
func holdDialogPID(t *testing.T, dialog string) (release func(), pid uint32) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM dialogs WHERE id=$1 FOR UPDATE", dialog).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release, pid
}

// waitBlocked waits until n backends wait for a lock that backend pid holds
// (a send transaction queued on a held dialog row).
func waitBlocked(t *testing.T, pool *pgxpool.Pool, pid uint32, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var got int
		if err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", pid).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got == n
	}, "backends waiting for the held lock never numbered %d", n)
}

type sendOutcome struct {
	m       store.Message
	created bool
	err     error
}

// queueSend starts a send and waits until the store holds it, so sends
// reach the combiner in the order queueSend is called.
func queueSend(t *testing.T, s *store.Store, ctx context.Context, in store.SendMessage) <-chan sendOutcome {
	t.Helper()
	before := s.SendQueueDepth(in.DialogID)
	out := make(chan sendOutcome, 1)
	go func() {
		m, _, created, err := s.SendMessage(ctx, in)
		out <- sendOutcome{m, created, err}
	}()
	waitDepth(t, s, in.DialogID, before+1)
	return out
}

func waitDepth(t *testing.T, s *store.Store, dialog string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.SendQueueDepth(dialog) != n {
		if time.Now().After(deadline) {
			t.Fatalf("send queue depth %d, want %d", s.SendQueueDepth(dialog), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A send over the dialog's queue bound is refused with ErrDialogBusy at
// once, and nothing of it is written; the queued sends go through.
func TestSendOverTheDialogQueueIsRefused(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(10 * time.Second) // the held lock must not end the queued sends
	s.SetSendQueue(2)
	f := newSendFixture(t, s, 2)
	release := holdDialog(t, f.dialog)
	ctx := context.Background()
	a := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "a"})
	b := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "b"})
	over := ids.New()
	if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: over, DialogID: f.dialog, SenderID: f.users[0], Body: "c"}); !errors.Is(err, store.ErrDialogBusy) {
		t.Fatalf("send over the bound: %v", err)
	}
	release()
	for _, ch := range []<-chan sendOutcome{a, b} {
		if o := <-ch; o.err != nil || !o.created {
			t.Fatalf("queued send: %v", o.err)
		}
	}
	if _, err := s.GetMessage(ctx, over); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("refused send was written: %v", err)
	}
	checkGapless(t, s, f.dialog, 2, nil)
}

// In one combined batch, a send with a bad attachment, from a non-member,
// with a refused value or with a used idempotency key fails alone; a
// clientMessageId repeated within the batch answers the first send's
// message; the others are written with gapless seqs in arrival order.
func TestABatchFailsOnlyItsBadSends(t *testing.T) {
	s, pool := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	s.SetSendLinger(0) // the lead's batch goes out alone, without waiting for company
	f := newSendFixture(t, s, 3)
	ctx := context.Background()
	alice, bob := f.users[1], f.users[2]
	att := uploadedAttachment(t, s, f.dialog, alice)
	other := uploadedAttachment(t, s, f.dialog, bob) // bob's: alice cannot send it
	key := store.IdemKey{Scope: "msg_send", UserID: alice, KeyHMAC: ids.New()}
	idemOf := func(key store.IdemKey) *store.IdemWrite[store.Message] {
		return &store.IdemWrite[store.Message]{Key: key, Fingerprint: "fp", TTL: time.Hour,
			Record: func(m store.Message) store.IdemRecord { return store.IdemRecord{Status: 201} }}
	}
	idem := func() *store.IdemWrite[store.Message] { return idemOf(key) }
	// The repeats come with keys of their own: each is recorded naming the
	// message its clientMessageId repeats.
	repeatKey := store.IdemKey{Scope: "msg_send", UserID: alice, KeyHMAC: ids.New()}
	leadRepeatKey := store.IdemKey{Scope: "msg_send", UserID: alice, KeyHMAC: ids.New()}
	release, holder := holdDialogPID(t, f.dialog)
	send := func(in store.SendMessage) <-chan sendOutcome {
		in.ID, in.DialogID = ids.New(), f.dialog
		if in.Body == "" {
			in.Body = "hello"
		}
		return queueSend(t, s, ctx, in)
	}
	// The first send is being written (waiting for the lock) when the
	// others arrive: they form the next batch, in this order.
	lead := send(store.SendMessage{SenderID: alice, Body: "lead", ClientMessageID: "lead"})
	waitBlocked(t, pool, holder, 1)
	badAtt := send(store.SendMessage{SenderID: alice, AttachmentIDs: []string{other}})
	withAtt := send(store.SendMessage{SenderID: alice, Body: "with attachment", ClientMessageID: "c1", AttachmentIDs: []string{att}, Idem: idem()})
	sameAtt := send(store.SendMessage{SenderID: bob, AttachmentIDs: []string{att}})
	stranger := send(store.SendMessage{SenderID: ids.New()})
	repeat := send(store.SendMessage{SenderID: alice, Body: "again", ClientMessageID: "c1", Idem: idemOf(repeatKey)})
	leadRepeat := send(store.SendMessage{SenderID: alice, Body: "lead again", ClientMessageID: "lead", Idem: idemOf(leadRepeatKey)})
	sameKey := send(store.SendMessage{SenderID: alice, Idem: idem()})
	nul := send(store.SendMessage{SenderID: bob, Body: "nul \x00 byte"})
	last := send(store.SendMessage{SenderID: bob, Body: "last"})
	release()

	get := func(ch <-chan sendOutcome) sendOutcome { return <-ch }
	oLead, oAtt, oLast := get(lead), get(withAtt), get(last)
	for name, o := range map[string]sendOutcome{"lead": oLead, "with attachment": oAtt, "last": oLast} {
		if o.err != nil || !o.created {
			t.Fatalf("%s: created %v: %v", name, o.created, o.err)
		}
	}
	if oLead.m.Seq != 1 || oAtt.m.Seq != 2 || oLast.m.Seq != 3 {
		t.Fatalf("seqs %d %d %d, want 1 2 3", oLead.m.Seq, oAtt.m.Seq, oLast.m.Seq)
	}
	if len(oAtt.m.Attachments) != 1 || oAtt.m.Attachments[0].ID != att {
		t.Fatalf("attachments of the sent message: %+v", oAtt.m.Attachments)
	}
	for name, c := range map[string]struct {
		ch   <-chan sendOutcome
		want error
	}{
		"bad attachment": {badAtt, store.ErrInvalidAttachment}, "attachment linked in the batch": {sameAtt, store.ErrInvalidAttachment},
		"non-member": {stranger, store.ErrDialogNotFound}, "used idempotency key": {sameKey, store.ErrIdemExists},
	} {
		if o := get(c.ch); !errors.Is(o.err, c.want) {
			t.Fatalf("%s: %v, want %v", name, o.err, c.want)
		}
	}
	// PostgreSQL refuses the NUL byte (22021 for a parameter; with the
	// simple protocol the query text itself is refused, 08P01).
	if o := get(nul); o.err == nil || o.created {
		t.Fatalf("NUL body: created %v: %v", o.created, o.err)
	}
	for name, c := range map[string]struct {
		ch   <-chan sendOutcome
		want store.Message
	}{"repeat within the batch": {repeat, oAtt.m}, "repeat of an earlier batch": {leadRepeat, oLead.m}} {
		o := get(c.ch)
		if o.err != nil || o.created || o.m.ID != c.want.ID || o.m.Seq != c.want.Seq || o.m.Body != c.want.Body {
			t.Fatalf("%s: %+v created %v: %v", name, o.m, o.created, o.err)
		}
	}
	for _, c := range []struct {
		key  store.IdemKey
		want store.Message
	}{{key, oAtt.m}, {repeatKey, oAtt.m}, {leadRepeatKey, oLead.m}} {
		rec, found, err := s.LookupIdempotency(ctx, c.key)
		if err != nil || !found || rec.ResourceID != c.want.ID || rec.Version != c.want.Seq || rec.Status != 201 {
			t.Fatalf("idempotency record %+v (found %v), want one naming message %d: %v", rec, found, c.want.Seq, err)
		}
	}
	checkGapless(t, s, f.dialog, 3, []store.Message{oLead.m, oAtt.m, oLast.m})
}

func uploadedAttachment(t *testing.T, s *store.Store, dialog, uploader string) string {
	t.Helper()
	ctx := context.Background()
	a, err := s.CreateAttachment(ctx, store.CreateAttachment{ID: ids.New(), DialogID: dialog, UploaderID: uploader,
		Filename: "f.txt", ContentType: "text/plain", SizeBytes: 3, UploadTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkAttachmentUploaded(ctx, a.ID, "blob/"+a.ID, "00"); err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// A caller whose context ends while its send waits behind another is
// answered with the context's error, and nothing of its send is written.
func TestASendCancelledWhileQueuedIsNotWritten(t *testing.T) {
	s, pool := openStore(t)
	s.SetRequestTimeout(10 * time.Second)
	// The first send's transaction starts at once and waits for the row;
	// only then is the second queued behind it (a batch waiting for company
	// would take it along into its transaction).
	s.SetSendLinger(0)
	f := newSendFixture(t, s, 2)
	release, holder := holdDialogPID(t, f.dialog)
	ctx := context.Background()
	first := queueSend(t, s, ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "first"})
	waitBlocked(t, pool, holder, 1)
	cctx, cancel := context.WithCancel(ctx)
	gone := ids.New()
	second := queueSend(t, s, cctx, store.SendMessage{ID: gone, DialogID: f.dialog, SenderID: f.users[1], Body: "gone"})
	cancel()
	if o := <-second; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled send: %v", o.err)
	}
	waitDepth(t, s, f.dialog, 1)
	release()
	if o := <-first; o.err != nil || o.m.Seq != 1 {
		t.Fatalf("first send: seq %d: %v", o.m.Seq, o.err)
	}
	if _, err := s.GetMessage(ctx, gone); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cancelled send was written: %v", err)
	}
	checkGapless(t, s, f.dialog, 1, nil)
}

// The outbox relay publishes a message.created event with exactly the
// bytes the request path got from the send: same event id, same frame.
func TestRelayPublishesTheSendsOwnFrame(t *testing.T) {
	s, _ := openStore(t)
	f := newSendFixture(t, s, 2)
	ctx := context.Background()
	att := uploadedAttachment(t, s, f.dialog, f.users[1])
	m, ev, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[1], Body: "relayed",
		AttachmentIDs: []string{att}, Event: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev.EntityID != m.ID || ev.Channel != pubsub.DialogChannel(f.dialog) || len(ev.Payload) == 0 {
		t.Fatalf("event %+v", ev)
	}
	var got []pubsub.OutboxRow
	for i := 0; len(got) == 0 && i < 100; i++ {
		if _, err := s.RelayOutbox(ctx, 0, 1000, func(_ context.Context, row pubsub.OutboxRow) error {
			if row.EventID == ev.EventID {
				got = append(got, row)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) == 0 {
		t.Fatal("the relay never claimed the event")
	}
	if string(got[0].Payload) != string(ev.Payload) || got[0].EntityID != m.ID || got[0].Channel != ev.Channel {
		t.Fatalf("relay frame\n%s\nrequest path frame\n%s", got[0].Payload, ev.Payload)
	}
}
