package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// mostSendsInOneTransaction is the largest number of the dialogs' messages
// that one transaction wrote.
func mostSendsInOneTransaction(t *testing.T, dialogs ...string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT COALESCE(max(c), 0) FROM (SELECT count(*) AS c FROM messages
		WHERE dialog_id = ANY ($1::text[]::uuid[]) GROUP BY xmin::text) AS x`, dialogs).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A backlog as large as the queues allow (32 dialogs × 256 sends, each with
// a clientMessageId, an idempotency record and an event, queued while the
// only send transaction waits on a lock) is written in transactions of at
// most MaxGroupSends sends. Every send is answered either written or
// database_busy (its budget ran out while it waited, nothing written);
// none fails as unavailable, which one statement carrying the whole backlog
// did once it outlived its sends' budget. Each dialog holds exactly its
// written sends, gapless.
func TestABacklogOfSendsIsAnsweredWrittenOrBusy(t *testing.T) {
	s, _ := openStore(t) // the default request budget
	const dialogs, per = 32, 256
	s.SetSendShare(per) // two senders fill each queue
	fixtures := make([]sendFixture, dialogs)
	names := make([]string, dialogs)
	for i := range fixtures {
		fixtures[i] = newSendFixture(t, s, 2)
		names[i] = fixtures[i].dialog
	}
	release, first := occupy(t, s)
	body := strings.Repeat("x", 4000)
	type answer struct {
		dialog int
		o      sendOutcome
	}
	outs := make(chan answer, dialogs*per)
	for d, f := range fixtures {
		for j := range per {
			sender := f.users[j%2]
			in := store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: sender, Body: body,
				ClientMessageID: fmt.Sprintf("c-%d", j), Event: true,
				Idem: &store.IdemWrite[store.Message]{Key: store.IdemKey{Scope: "msg_send", UserID: sender, KeyHMAC: ids.New()},
					Fingerprint: "fp", TTL: time.Hour,
					Record: func(store.Message) store.IdemRecord { return store.IdemRecord{Status: 201} }}}
			go func() {
				m, _, created, err := s.SendMessage(context.Background(), in)
				outs <- answer{d, sendOutcome{m, created, err}}
			}()
		}
	}
	// Every send reached the store: queued, or already answered (under a
	// slow run the committer's lock wait may end before all are queued).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		reached := len(outs)
		for _, f := range fixtures {
			reached += s.SendQueueDepth(f.dialog)
		}
		if reached == dialogs*per {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sends reached the store", reached, dialogs*per)
		}
	}
	release()
	<-first
	written := make([][]store.Message, dialogs)
	var busy, other int
	var sample error
	for range dialogs * per {
		a := <-outs
		switch {
		case a.o.err == nil && a.o.created:
			written[a.dialog] = append(written[a.dialog], a.o.m)
		case errors.Is(a.o.err, store.ErrDatabaseBusy):
			busy++
		default:
			other++
			sample = fmt.Errorf("created %v: %w", a.o.created, a.o.err)
		}
	}
	total := 0
	for _, w := range written {
		total += len(w)
	}
	t.Logf("%d sends: %d written, %d database_busy", dialogs*per, total, busy)
	if other > 0 {
		t.Fatalf("%d of %d queued sends were answered neither written nor busy (e.g. %v)", other, dialogs*per, sample)
	}
	for d, f := range fixtures {
		if len(written[d]) > 0 {
			checkGapless(t, s, f.dialog, len(written[d]), written[d])
		} else {
			checkEmpty(t, s, f.dialog)
		}
	}
	if n := mostSendsInOneTransaction(t, names...); n > store.MaxGroupSends {
		t.Fatalf("one transaction wrote %d sends, want at most %d", n, store.MaxGroupSends)
	}
}

// A dialog whose queue holds more sends than one transaction writes is
// written in several, one after the other: each send is created, seqs in
// arrival order across them, none with more than MaxGroupSends sends.
func TestADialogsBacklogIsWrittenInOrderAcrossTransactions(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(30 * time.Second) // every send is written within its budget
	n := store.MaxGroupSends + 88
	s.SetSendQueue(n)
	s.SetSendShare(n) // three senders fill the queue
	release, first := occupy(t, s)
	f := newSendFixture(t, s, 3)
	outs := make([]<-chan sendOutcome, n)
	for i := range outs {
		outs[i] = queueSend(t, s, context.Background(), store.SendMessage{ID: ids.New(), DialogID: f.dialog,
			SenderID: f.users[i%3], Body: fmt.Sprintf("send %d", i), ClientMessageID: fmt.Sprintf("c-%d", i)})
	}
	release()
	<-first
	msgs := make([]store.Message, n)
	for i, ch := range outs {
		o := <-ch
		if o.err != nil || !o.created || o.m.Seq != int64(i+1) || o.m.Body != fmt.Sprintf("send %d", i) {
			t.Fatalf("send %d: seq %d created %v: %v, want seq %d", i, o.m.Seq, o.created, o.err, i+1)
		}
		msgs[i] = o.m
	}
	checkGapless(t, s, f.dialog, n, msgs)
	if most := mostSendsInOneTransaction(t, f.dialog); most > store.MaxGroupSends {
		t.Fatalf("one transaction wrote %d sends, want at most %d", most, store.MaxGroupSends)
	}
	if txs := transactionsOf(t, msgs...); txs < 2 {
		t.Fatalf("%d sends were written by %d transaction(s)", n, txs)
	}
}
