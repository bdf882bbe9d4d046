package restapi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// 100 members send two messages each into one dialog at once over HTTP,
// each member its second after its first answered (an answer that says to
// try again is retried under the same key, as a client does: on a loaded
// machine the database or Redis may be over its budget): the answers carry
// seqs 1..200 without a gap, each answer is the message the history holds, and
// each member's second message comes after its first. A replay of a send
// under its Idempotency-Key answers the same bytes.
func TestHundredMembersSendingAtOnceGetGaplessSeqs(t *testing.T) {
	h := newHarness(t)
	const members = 100
	ids := make([]string, members)
	toks := make([]string, members)
	for i := range ids {
		ids[i], toks[i] = h.user()
		if code, b := h.do(toks[i], "GET", "/v1/me", ""); code != 200 {
			t.Fatalf("first request: %d %s", code, b)
		}
	}
	d := h.dialog(toks[0], ids[1:]...)
	path := "/v1/dialogs/" + d.ID + "/messages"
	type sent struct {
		m    [2]messageResp
		raw  []byte
		keys [2]map[string]string
	}
	out := make([]sent, members)
	var wg sync.WaitGroup
	errs := make(chan string, members)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 2; k++ {
				key := idemKey()
				code, b := sendRetrying(h, toks[i], path, fmt.Sprintf(`{"body":"m %d/%d"}`, i, k), key)
				if code != 201 {
					errs <- fmt.Sprintf("member %d send %d: %d %s", i, k, code, b)
					return
				}
				out[i].m[k], out[i].keys[k] = decode[messageResp](t, b), key
				if k == 1 {
					out[i].raw = b
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	var history []messageResp
	for after := int64(0); ; {
		_, b := h.do(toks[0], "GET", fmt.Sprintf("%s?limit=100&afterSeq=%d", path, after), "")
		page := decode[listResp[messageResp]](t, b)
		history = append(history, page.Items...)
		if page.NextCursor == nil {
			break
		}
		after = page.Items[len(page.Items)-1].Seq
	}
	if len(history) != 2*members {
		t.Fatalf("history holds %d messages, want %d", len(history), 2*members)
	}
	for i, m := range history {
		if m.Seq != int64(i+1) {
			t.Fatalf("history seq %d at position %d: not gapless", m.Seq, i+1)
		}
	}
	for i, s := range out {
		if s.m[1].Seq <= s.m[0].Seq {
			t.Fatalf("member %d: second message seq %d not after the first %d", i, s.m[1].Seq, s.m[0].Seq)
		}
		for _, m := range s.m {
			if history[m.Seq-1] != m || m.SenderID != ids[i] {
				t.Fatalf("answer %+v, history %+v", m, history[m.Seq-1])
			}
		}
	}
	code, replay, _ := h.doH(toks[7], "POST", path, `{"body":"m 7/1"}`, out[7].keys[1])
	if code != 201 || string(replay) != string(out[7].raw) {
		t.Fatalf("replay: %d %s, first answer %s", code, replay, out[7].raw)
	}
}

// sendRetrying sends body under key as a client does: an answer that
// tells it to try again (503 with Retry-After: a busy database or dialog,
// Redis over its budget on a loaded machine; 409 idempotency_in_progress
// while the first attempt is still being written) is retried under the
// same key after a short pause, for up to 30 s; any other answer is
// returned. The retries are what the idempotency key is for: a send that
// was written although its answer said otherwise is answered with the
// message written, never written twice.
func sendRetrying(h *harness, tok, path, body string, key map[string]string) (int, []byte) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, b, _ := h.doH(tok, "POST", path, body, key)
		retry := code == 503 || (code == 409 && strings.Contains(string(b), `"idempotency_in_progress"`))
		if !retry || time.Now().After(deadline) {
			return code, b
		}
		time.Sleep(100*time.Millisecond + time.Duration(rand.IntN(100))*time.Millisecond)
	}
}

// Over HAN_SEND_DIALOG_QUEUE sends into one dialog on one instance, a send
// is answered 503 dialog_busy with Retry-After at once, nothing written;
// retried under the same Idempotency-Key once the dialog is free, it
// succeeds.
func TestSendOverTheDialogQueueAnswersDialogBusy(t *testing.T) {
	h := newHarness(t)
	h.store.SetSendQueue(1)
	h.store.SetRequestTimeout(20 * time.Second) // the held lock must not end the queued send
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"

	ctx := context.Background()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id=$1 FOR UPDATE", d.ID); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code  int
		body  string
		retry string
		sent  string
		key   map[string]string
	}
	answers := make(chan answer, 3)
	for i := 0; i < 3; i++ {
		go func() {
			key, body := idemKey(), fmt.Sprintf(`{"body":"b%d"}`, i)
			code, b, hdr := h.doH(aTok, "POST", path, body, key)
			answers <- answer{code, string(b), hdr.Get("Retry-After"), body, key}
		}()
	}
	// The queue holds one send (waiting for the lock); the other two are
	// refused while the lock is still held.
	var busy []answer
	for len(busy) < 2 {
		a := <-answers
		if a.code != 503 || a.body != `{"error":"dialog_busy"}` || a.retry != "1" {
			t.Fatalf("send over the queue: %d %s Retry-After=%q", a.code, a.body, a.retry)
		}
		busy = append(busy, a)
	}
	_ = tx.Rollback(ctx)
	conn.Release()
	if a := <-answers; a.code != 201 {
		t.Fatalf("queued send: %d %s", a.code, a.body)
	}
	for i, a := range busy {
		code, b, _ := h.doH(aTok, "POST", path, a.sent, a.key)
		if code != 201 || decode[messageResp](t, b).Seq != int64(i+2) {
			t.Fatalf("retry of a refused send: %d %s", code, b)
		}
	}
}

// A send into a dialog whose queue on this instance is full is answered 503
// dialog_busy only to a member: a sender who is no member of the dialog gets
// 404 dialog_not_found, exactly as a send into an unknown dialog id does, so
// an outsider learns neither that the dialog exists nor that it is busy.
func TestAnOutsidersSendIntoABusyDialogIsAnsweredAsAnUnknownDialog(t *testing.T) {
	h := newHarness(t)
	h.store.SetSendQueue(1)
	h.store.SetRequestTimeout(20 * time.Second) // the held lock must not end the queued send
	_, aTok := h.user()
	bob, bTok := h.user()
	_, eTok := h.user()
	d := h.dialog(aTok, bob)
	ctx := context.Background()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var pid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM dialogs WHERE id=$1 FOR UPDATE", d.ID).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	queued := make(chan int, 1)
	go func() {
		code, _, _ := h.sendTo(aTok, d.ID, `{"body":"queued"}`, idemKey())
		queued <- code
	}()
	// The queued send waits for the held row lock: the queue is full.
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}, "the queued send never waited for the dialog's lock")
	code, b, _ := h.sendTo(bTok, d.ID, `{"body":"member"}`, idemKey())
	wantError(t, code, b, 503, "dialog_busy")
	for _, target := range []string{d.ID, ids.New()} {
		code, b, hdr := h.sendTo(eTok, target, `{"body":"outsider"}`, idemKey())
		wantError(t, code, b, 404, "dialog_not_found")
		if hdr.Get("Retry-After") != "" {
			t.Fatalf("outsider's send: Retry-After %q", hdr.Get("Retry-After"))
		}
	}
	_ = tx.Rollback(ctx)
	if code := <-queued; code != 201 {
		t.Fatalf("queued send: %d", code)
	}
}
