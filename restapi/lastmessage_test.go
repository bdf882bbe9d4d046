package restapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// listedDialogRaw is a listing item with its lastMessage kept as the bytes
// the server wrote.
type listedDialogRaw struct {
	ID          string          `json:"id"`
	LastSeq     int64           `json:"lastSeq"`
	LastMessage json.RawMessage `json:"lastMessage"`
}

// listingRaw reads every page of the caller's listing (limit per page).
func (h *harness) listingRaw(tok string, limit int) map[string]listedDialogRaw {
	h.t.Helper()
	out := map[string]listedDialogRaw{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			h.t.Fatal("paging does not end")
		}
		path := fmt.Sprintf("/v1/dialogs?limit=%d", limit)
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		code, b := h.do(tok, "GET", path, "")
		if code != 200 {
			h.t.Fatalf("listing: %d %s", code, b)
		}
		l := decode[listResp[listedDialogRaw]](h.t, b)
		for _, d := range l.Items {
			if d.LastMessage == nil {
				h.t.Fatalf("an item without the lastMessage field: %s", b)
			}
			out[d.ID] = d
		}
		if l.NextCursor == nil {
			return out
		}
		cursor = *l.NextCursor
	}
}

// historyTail returns the bytes of the dialog's newest message as the
// history endpoint renders it.
func (h *harness) historyTail(tok, dialogID string, lastSeq int64) json.RawMessage {
	h.t.Helper()
	code, b := h.do(tok, "GET", fmt.Sprintf("/v1/dialogs/%s/messages?afterSeq=%d&limit=1", dialogID, lastSeq-1), "")
	if code != 200 {
		h.t.Fatalf("history: %d %s", code, b)
	}
	l := decode[listResp[json.RawMessage]](h.t, b)
	if len(l.Items) != 1 {
		h.t.Fatalf("history tail: %s", b)
	}
	return l.Items[0]
}

func (h *harness) send(tok, dialogID, body string) []byte {
	h.t.Helper()
	code, b, _ := h.doH(tok, "POST", "/v1/dialogs/"+dialogID+"/messages", body, idemKey())
	if code != 201 {
		h.t.Fatalf("send %s: %d %s", body, code, b)
	}
	return b
}

// Each listed dialog carries its newest message, byte for byte as the
// history renders it (attachments included), or null without messages;
// on every page, in the listing's own order.
func TestDialogListingCarriesTheLastMessage(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	alice, aTok := h.user()
	bob, bTok := h.user()
	empty := h.dialog(aTok, bob)
	talk := h.dialog(aTok, bob)
	files := h.dialog(bTok, alice)

	h.send(aTok, talk.ID, `{"body":"first"}`)
	// JSON escapes, control characters, HTML-significant characters,
	// U+2028, an emoji with a skin tone modifier and one outside the BMP
	// given as a surrogate pair: the listing shows what the history shows.
	odd := `{"body":"h\u00e9llo \ud83d\udc4b\ud83c\udffd \u0001\t\n<b>&amp;</b> \"q\" \\ \u2028 \ud834\udd1e end"}`
	h.send(bTok, talk.ID, odd)
	att := h.uploadedAttachment(bTok, files.ID)
	h.send(bTok, files.ID, fmt.Sprintf(`{"body":"see file","attachmentIds":[%q]}`, att.ID))
	// U+0000 is refused (400 invalid_body); the newest message stays.
	code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+talk.ID+"/messages", `{"body":"nul \u0000 here"}`, idemKey())
	wantError(t, code, b, 400, "invalid_body")
	// Invalid UTF-8 never reaches PostgreSQL (400 invalid_json).
	code, b, _ = h.doH(aTok, "POST", "/v1/dialogs/"+talk.ID+"/messages", "{\"body\":\"bad \xff\xfe\"}", idemKey())
	wantError(t, code, b, 400, "invalid_json")

	for _, limit := range []int{100, 1} {
		for _, tok := range []string{aTok, bTok} {
			got := h.listingRaw(tok, limit)
			if len(got) != 3 {
				t.Fatalf("listed %d dialogs, want 3", len(got))
			}
			if m := got[empty.ID].LastMessage; string(m) != "null" {
				t.Fatalf("a dialog without messages: lastMessage %s, want null", m)
			}
			for _, id := range []string{talk.ID, files.ID} {
				d := got[id]
				want := h.historyTail(tok, id, d.LastSeq)
				if !bytes.Equal(d.LastMessage, want) {
					t.Fatalf("lastMessage of %s:\n%s\nhistory renders:\n%s", id, d.LastMessage, want)
				}
			}
		}
	}
	got := h.listingRaw(aTok, 100)
	var m struct {
		Seq         int64
		SenderID    string
		Body        string
		Attachments []attachmentResp
	}
	if err := json.Unmarshal(got[talk.ID].LastMessage, &m); err != nil {
		t.Fatal(err)
	}
	wantBody := "h\u00e9llo \U0001F44B\U0001F3FD \x01\t\n<b>&amp;</b> \"q\" \\ \u2028 \U0001D11E end"
	if m.Seq != 2 || m.SenderID != bob || m.Body != wantBody || m.Attachments == nil || len(m.Attachments) != 0 {
		t.Fatalf("talk's lastMessage: %s", got[talk.ID].LastMessage)
	}
	if err := json.Unmarshal(got[files.ID].LastMessage, &m); err != nil {
		t.Fatal(err)
	}
	if m.Body != "see file" || len(m.Attachments) != 1 || m.Attachments[0].ID != att.ID || m.Attachments[0].Filename != "a.txt" {
		t.Fatalf("files' lastMessage: %s", got[files.ID].LastMessage)
	}
}

// A user sees the last message of their own dialogs only: another
// dialog's message appears in no page of their listing.
func TestDialogListingHidesOthersLastMessages(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, _ := h.user()
	_, cTok := h.user()
	dave, _ := h.user()
	mine := h.dialog(aTok, bob)
	theirs := h.dialog(cTok, dave)
	shared := h.dialog(cTok, alice)
	secret := "carol to dave " + theirs.ID
	h.send(cTok, theirs.ID, fmt.Sprintf(`{"body":%q}`, secret))
	h.send(cTok, shared.ID, `{"body":"hi alice"}`)

	code, b := h.do(aTok, "GET", "/v1/dialogs?limit=1", "")
	for pages := 0; ; pages++ {
		if code != 200 || pages > 5 {
			t.Fatalf("listing: %d %s", code, b)
		}
		if strings.Contains(string(b), secret) || strings.Contains(string(b), theirs.ID) {
			t.Fatalf("alice's listing shows another dialog: %s", b)
		}
		l := decode[listResp[listedDialogRaw]](t, b)
		if l.NextCursor == nil {
			break
		}
		code, b = h.do(aTok, "GET", "/v1/dialogs?limit=1&cursor="+*l.NextCursor, "")
	}
	got := h.listingRaw(aTok, 100)
	if len(got) != 2 || string(got[mine.ID].LastMessage) != "null" || !strings.Contains(string(got[shared.ID].LastMessage), `"body":"hi alice"`) {
		t.Fatalf("alice's listing: %+v", got)
	}
	if got := h.listingRaw(cTok, 100); len(got) != 2 || !strings.Contains(string(got[theirs.ID].LastMessage), secret) {
		t.Fatalf("carol's listing: %+v", got)
	}
}
