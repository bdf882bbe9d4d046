package restapi_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

type dialogResp struct {
	ID        string   `json:"id"`
	Title     string   `json:"title"`
	MemberIDs []string `json:"memberIds"`
	LastSeq   int64    `json:"lastSeq"`
	CreatedAt int64    `json:"createdAt"`
}

type messageResp struct {
	ID        string `json:"id"`
	DialogID  string `json:"dialogId"`
	Seq       int64  `json:"seq"`
	SenderID  string `json:"senderId"`
	Body      string `json:"body"`
	CreatedAt int64  `json:"createdAt"`
}

type listResp[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"nextCursor"`
}

func (h *harness) dialog(tok string, members ...string) dialogResp {
	h.t.Helper()
	body := fmt.Sprintf(`{"memberIds":["%s"],"title":"t"}`, strings.Join(members, `","`))
	code, b := h.do(tok, "POST", "/v1/dialogs", body)
	if code != 201 {
		h.t.Fatalf("create dialog: %d %s", code, b)
	}
	return decode[dialogResp](h.t, b)
}

func TestChatFlow(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, bTok := h.user()

	before := time.Now().UnixMilli()
	d := h.dialog(aTok, bob)
	if d.Title != "t" || d.LastSeq != 0 || len(d.MemberIDs) != 2 || d.MemberIDs[0] != alice || d.MemberIDs[1] != bob {
		t.Fatalf("dialog DTO: %+v", d)
	}
	if d.CreatedAt < before-1000 || d.CreatedAt > time.Now().UnixMilli()+1000 {
		t.Fatalf("createdAt is not epoch ms: %d", d.CreatedAt)
	}

	for i := 1; i <= 5; i++ {
		tok := aTok
		if i%2 == 0 {
			tok = bTok
		}
		code, b, _ := h.doH(tok, "POST", "/v1/dialogs/"+d.ID+"/messages", fmt.Sprintf(`{"body":"hello %d"}`, i), idemKey())
		if code != 201 {
			t.Fatalf("send %d: %d %s", i, code, b)
		}
		m := decode[messageResp](t, b)
		if m.Seq != int64(i) || m.DialogID != d.ID || m.Body != fmt.Sprintf("hello %d", i) || !ids.Valid(m.ID) {
			t.Fatalf("message DTO: %+v", m)
		}
	}

	// Reconciliation: afterSeq pages in ascending seq; nextCursor is the
	// last seq while more exist.
	code, b := h.do(bTok, "GET", "/v1/dialogs/"+d.ID+"/messages?afterSeq=1&limit=2", "")
	if code != 200 {
		t.Fatalf("history: %d %s", code, b)
	}
	page := decode[listResp[messageResp]](t, b)
	if len(page.Items) != 2 || page.Items[0].Seq != 2 || page.Items[1].Seq != 3 || page.NextCursor == nil || *page.NextCursor != "3" {
		t.Fatalf("page 1: %s", b)
	}
	_, b = h.do(bTok, "GET", "/v1/dialogs/"+d.ID+"/messages?afterSeq="+*page.NextCursor+"&limit=2", "")
	page = decode[listResp[messageResp]](t, b)
	if len(page.Items) != 2 || page.Items[0].Seq != 4 || page.Items[1].Seq != 5 || page.NextCursor != nil {
		t.Fatalf("page 2 should be the last: %s", b)
	}
	if !strings.Contains(string(b), `"nextCursor":null`) {
		t.Fatalf("nextCursor must be null on the last page: %s", b)
	}

	// The dialog listing shows lastSeq.
	_, b = h.do(bTok, "GET", "/v1/dialogs", "")
	dl := decode[listResp[dialogResp]](t, b)
	if len(dl.Items) != 1 || dl.Items[0].ID != d.ID || dl.Items[0].LastSeq != 5 {
		t.Fatalf("dialogs: %s", b)
	}
}

func TestDialogListingPages(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	want := map[string]bool{}
	for i := 0; i < 5; i++ {
		want[h.dialog(aTok, bob).ID] = true
	}
	got := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		path := "/v1/dialogs?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		code, b := h.do(aTok, "GET", path, "")
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		l := decode[listResp[dialogResp]](t, b)
		for _, d := range l.Items {
			if got[d.ID] {
				t.Fatalf("dialog %s listed twice", d.ID)
			}
			got[d.ID] = true
		}
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d dialogs, want %d", len(got), len(want))
	}
	code, b := h.do(aTok, "GET", "/v1/dialogs?cursor=bm9wZQ", "")
	wantError(t, code, b, 400, "invalid_cursor")
}

// A dialog-listing cursor is opaque to the client, which may still send
// anything: one the service did not hand out is 400 invalid_cursor, even
// when it has the right shape (a time, ":", 36 bytes). Neither its id nor
// its time reaches PostgreSQL, so it is no server error and logs nothing.
func TestForgedDialogCursorIsInvalidCursor(t *testing.T) {
	h, logs := newHarness(t).withLog(nil)
	_, aTok := h.user()
	bob, _ := h.user()
	h.dialog(aTok, bob)
	id := ids.New()
	for _, c := range []struct{ name, raw string }{
		{"time before year 1", "-9223372036854775808:" + id},
		{"time after year 9999", "9223372036854775807:" + id},
		{"id not hex", "1700000000000000:" + strings.Repeat("z", 36)},
		{"id without dashes", "1700000000000000:" + strings.ReplaceAll(id, "-", "") + "abcd"},
		{"id of NUL bytes", "1700000000000000:" + strings.Repeat("\x00", 36)},
		{"id not UTF-8", "1700000000000000:" + strings.Repeat("\xff", 36)},
	} {
		cursor := base64.RawURLEncoding.EncodeToString([]byte(c.raw))
		if code, b := h.do(aTok, "GET", "/v1/dialogs?cursor="+cursor, ""); code != 400 || string(b) != `{"error":"invalid_cursor"}` {
			t.Errorf("%s: %d %s, want 400 invalid_cursor", c.name, code, b)
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) {
			t.Errorf("log: %s", line)
		}
	}
}

func TestNonMemberGets404(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	_, cTok := h.user()
	d := h.dialog(aTok, bob)

	code, b, _ := h.doH(cTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"let me in"}`, idemKey())
	wantError(t, code, b, 404, "dialog_not_found")
	code, b = h.do(cTok, "GET", "/v1/dialogs/"+d.ID+"/messages", "")
	wantError(t, code, b, 404, "dialog_not_found")
	// An unknown dialog looks exactly the same.
	code, b = h.do(cTok, "GET", "/v1/dialogs/"+ids.New()+"/messages", "")
	wantError(t, code, b, 404, "dialog_not_found")

	var n int
	if err := h.pool.QueryRow(context.Background(), "SELECT count(*) FROM messages WHERE dialog_id=$1", d.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("non-member send wrote %d rows (%v)", n, err)
	}
}

// 50 sends into one dialog at once, five from each of ten members (within
// a sender's share of the dialog's queue), get seqs 1..50.
func TestConcurrentSendsGetGaplessSeq(t *testing.T) {
	h := newHarness(t)
	toks := make([]string, 10)
	members := make([]string, len(toks)-1)
	_, toks[0] = h.user()
	for i := range members {
		members[i], toks[i+1] = h.user()
	}
	d := h.dialog(toks[0], members...)

	const n = 50
	seqs := make([]int64, n)
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tok := toks[i%len(toks)]
			code, b, _ := h.doH(tok, "POST", "/v1/dialogs/"+d.ID+"/messages", fmt.Sprintf(`{"body":"m%d"}`, i), idemKey())
			if code != 201 {
				errs <- fmt.Sprintf("send %d: %d %s", i, code, b)
				return
			}
			var m messageResp
			m = decode[messageResp](t, b)
			seqs[i] = m.Seq
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("seqs are not 1..%d without gaps or duplicates: %v", n, seqs)
		}
	}
	// PostgreSQL agrees, and the dialog's lastSeq is n.
	_, b := h.do(toks[0], "GET", "/v1/dialogs/"+d.ID+"/messages?limit=100", "")
	l := decode[listResp[messageResp]](t, b)
	if len(l.Items) != n || l.Items[n-1].Seq != n {
		t.Fatalf("history has %d items", len(l.Items))
	}
}

func TestClientMessageIDDeduplicates(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	body := `{"body":"once","clientMessageId":"c-1"}`
	// Two different Idempotency-Keys: the clientMessageId alone deduplicates.
	_, b1, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", body, idemKey())
	code, b2, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", body, idemKey())
	if code != 201 || decode[messageResp](t, b1).ID != decode[messageResp](t, b2).ID {
		t.Fatalf("resend with the same clientMessageId must return the same message: %s vs %s", b1, b2)
	}
	_, b := h.do(aTok, "GET", "/v1/dialogs/"+d.ID+"/messages", "")
	if l := decode[listResp[messageResp]](t, b); len(l.Items) != 1 {
		t.Fatalf("want one message, got %d", len(l.Items))
	}
}

func TestChatValidation(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	msgs := "/v1/dialogs/" + d.ID + "/messages"
	long := strings.Repeat("é", 4001)
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"empty body", "POST", msgs, `{"body":""}`, 400, "invalid_body"},
		{"blank body", "POST", msgs, `{"body":"  \n "}`, 400, "invalid_body"},
		{"missing body", "POST", msgs, `{}`, 400, "invalid_body"},
		{"body over 4000 chars", "POST", msgs, `{"body":"` + long + `"}`, 400, "invalid_body"},
		{"body wrong type", "POST", msgs, `{"body":5}`, 400, "invalid_json"},
		{"malformed", "POST", msgs, `{"body":`, 400, "invalid_json"},
		{"not an object", "POST", msgs, `["x"]`, 400, "invalid_json"},
		{"duplicate key", "POST", msgs, `{"body":"a","body":"b"}`, 400, "invalid_json"},
		{"lone surrogate", "POST", msgs, `{"body":"\ud800"}`, 400, "invalid_json"},
		{"invalid utf-8", "POST", msgs, "{\"body\":\"\xff\"}", 400, "invalid_json"},
		{"bad dialog id", "POST", "/v1/dialogs/nope/messages", `{"body":"x"}`, 400, "invalid_uuid"},
		{"bad client id", "POST", msgs, `{"body":"x","clientMessageId":"has space"}`, 400, "invalid_client_message_id"},
		{"limit 0", "GET", msgs + "?limit=0", "", 400, "invalid_limit"},
		{"limit 101", "GET", msgs + "?limit=101", "", 400, "invalid_limit"},
		{"limit text", "GET", msgs + "?limit=ten", "", 400, "invalid_limit"},
		{"afterSeq negative", "GET", msgs + "?afterSeq=-1", "", 400, "invalid_cursor"},
		{"no members", "POST", "/v1/dialogs", `{"memberIds":[]}`, 400, "invalid_members"},
		{"members missing", "POST", "/v1/dialogs", `{"title":"x"}`, 400, "invalid_members"},
		{"member not uuid", "POST", "/v1/dialogs", `{"memberIds":["x"]}`, 400, "invalid_members"},
		{"unknown member", "POST", "/v1/dialogs", `{"memberIds":["` + ids.New() + `"]}`, 404, "user_not_found"},
		{"title too long", "POST", "/v1/dialogs", `{"memberIds":["` + bob + `"],"title":"` + strings.Repeat("x", 201) + `"}`, 400, "invalid_title"},
		{"unknown route", "GET", "/v1/nothing", "", 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b, _ := h.doH(aTok, c.method, c.path, c.body, idemKey())
			wantError(t, code, b, c.status, c.code)
		})
	}
	// Nothing was written by any rejected send.
	_, b := h.do(aTok, "GET", msgs, "")
	if l := decode[listResp[messageResp]](t, b); len(l.Items) != 0 {
		t.Fatalf("rejected requests wrote %d messages", len(l.Items))
	}
}

// A client that pages the history by following nextCursor with ?cursor=
// (as in every other listing) gets every message exactly once, in seq
// order, and reaches the end; cursor is an alias of afterSeq.
func TestHistoryPagingFollowsNextCursor(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)
	const n = 250
	for i := 1; i <= n; i++ {
		if _, _, _, err := h.store.SendMessage(context.Background(), store.SendMessage{
			ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: fmt.Sprintf("m%d", i),
		}); err != nil {
			t.Fatal(err)
		}
	}
	base := "/v1/dialogs/" + d.ID + "/messages"
	for _, q := range []string{"", "?limit=100", "?limit=7&_=1700000000"} {
		t.Run("query "+q, func(t *testing.T) {
			var seqs []int64
			path := base + q
			for pages := 0; ; pages++ {
				if pages > n {
					t.Fatalf("paging does not end: %d pages, %d messages", pages, len(seqs))
				}
				code, b := h.do(bTok, "GET", path, "")
				if code != 200 {
					t.Fatalf("GET %s: %d %s", path, code, b)
				}
				page := decode[listResp[messageResp]](t, b)
				for _, m := range page.Items {
					seqs = append(seqs, m.Seq)
				}
				if page.NextCursor == nil {
					break
				}
				sep := "?"
				if q != "" {
					sep = "&"
				}
				path = base + q + sep + "cursor=" + *page.NextCursor
			}
			if len(seqs) != n {
				t.Fatalf("got %d messages, want %d", len(seqs), n)
			}
			for i, s := range seqs {
				if s != int64(i+1) {
					t.Fatalf("message %d has seq %d: every message exactly once, in order", i, s)
				}
			}
		})
	}
	// cursor and afterSeq mean the same; both at once, or a cursor that is
	// not a seq, is refused.
	_, viaCursor := h.do(bTok, "GET", base+"?cursor=240", "")
	_, viaAfter := h.do(bTok, "GET", base+"?afterSeq=240", "")
	if string(viaCursor) != string(viaAfter) || len(decode[listResp[messageResp]](t, viaCursor).Items) != 10 {
		t.Fatalf("cursor=240 answered %s, afterSeq=240 answered %s", viaCursor, viaAfter)
	}
	for _, q := range []string{"?cursor=5&afterSeq=5", "?afterSeq=1&cursor=2", "?cursor=abc", "?cursor=-1", "?cursor=1.5",
		"?cursor=" + b64("10"), "?cursor=99999999999999999999"} {
		code, b := h.do(bTok, "GET", base+q, "")
		wantError(t, code, b, 400, "invalid_cursor")
	}
}
