package restapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// Field names of request bodies are matched exactly, as every other JSON
// reader matches them: a member whose name differs only in letter case
// ("BODY", "Title", "DATA") is an unknown member and ignored. Go's decoders
// would take it for the field, and the last of the two would win, so what
// the server stored and published differed from what a proxy, a moderation
// hook or the sender's own client read in the same bytes.
func TestRequestFieldNamesMatchOnlyExactly(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	msgs := "/v1/dialogs/" + d.ID + "/messages"

	code, b, _ := h.doH(aTok, "POST", msgs, `{"body":"shown","BODY":"hidden"}`, idemKey())
	if code != 201 || decode[messageResp](t, b).Body != "shown" {
		t.Fatalf(`send {"body":"shown","BODY":"hidden"}: %d %s`, code, b)
	}
	code, b, _ = h.doH(aTok, "POST", msgs, `{"Body":"only a case variant"}`, idemKey())
	wantError(t, code, b, 400, "invalid_body")
	if tail := decode[listResp[messageResp]](t, h.history(aTok, d.ID)); len(tail.Items) != 1 || tail.Items[0].Body != "shown" {
		t.Fatalf("history: %+v", tail.Items)
	}

	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":"shown","Title":"hidden"}`, bob))
	if code != 201 || decode[dialogResp](t, b).Title != "shown" {
		t.Fatalf("create with title and Title: %d %s", code, b)
	}
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"MemberIds":[%q]}`, bob))
	wantError(t, code, b, 400, "invalid_members")

	svc := h.serviceToken("billing")
	code, b = h.do(svc, "POST", "/v1/internal/inbox",
		fmt.Sprintf(`{"id":"case-1","kind":"k","dialogId":%q,"data":{"shown":1},"DATA":{"hidden":1}}`, d.ID))
	if code != 201 {
		t.Fatalf("inbox with data and DATA: %d %s", code, b)
	}
	var payload string
	if err := h.pool.QueryRow(context.Background(),
		"SELECT convert_from(payload, 'UTF8') FROM outbox WHERE entity_id='case-1'").Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if want := `"data":{"shown":1}`; !strings.Contains(payload, want) {
		t.Fatalf("inbox event %s, want %s", payload, want)
	}
}

func (h *harness) history(tok, dialogID string) []byte {
	h.t.Helper()
	code, b := h.do(tok, "GET", "/v1/dialogs/"+dialogID+"/messages", "")
	if code != 200 {
		h.t.Fatalf("history: %d %s", code, b)
	}
	return b
}
