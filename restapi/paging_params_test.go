package restapi_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A paging parameter given twice is refused (limit: invalid_limit; cursor,
// afterSeq: invalid_cursor), as cursor and afterSeq together are, instead
// of the first value being used and the other ignored: a client that builds
// the next page's URL by appending &cursor=<nextCursor> to the previous one
// got the same page again and again, and never reached the end.
func TestRepeatedPagingParametersAreRefused(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	h.dialog(aTok, bob)
	for i := 1; i <= 3; i++ {
		if _, _, _, err := h.store.SendMessage(context.Background(), store.SendMessage{
			ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: fmt.Sprintf("m%d", i),
		}); err != nil {
			t.Fatal(err)
		}
	}
	msgs := "/v1/dialogs/" + d.ID + "/messages"
	_, b := h.do(aTok, "GET", "/v1/dialogs?limit=1", "")
	next := decode[listResp[dialogResp]](t, b).NextCursor
	if next == nil {
		t.Fatal("two dialogs, limit 1: no nextCursor")
	}
	for _, c := range []struct{ path, code string }{
		{msgs + "?limit=1&cursor=1&cursor=2", "invalid_cursor"},
		{msgs + "?cursor=&cursor=2", "invalid_cursor"},
		{msgs + "?afterSeq=1&afterSeq=1", "invalid_cursor"},
		{msgs + "?afterSeq=1&afterSeq=", "invalid_cursor"},
		{msgs + "?limit=1&limit=100", "invalid_limit"},
		{msgs + "?limit=2&limit=2", "invalid_limit"},
		{"/v1/dialogs?limit=1&limit=100", "invalid_limit"},
		{"/v1/dialogs?limit=1&cursor=" + *next + "&cursor=" + *next, "invalid_cursor"},
		{"/v1/dialogs?cursor=&cursor=" + *next, "invalid_cursor"},
	} {
		code, b := h.do(aTok, "GET", c.path, "")
		wantError(t, code, b, 400, c.code)
	}
	// Each once, and other parameters repeated, as before.
	code, b := h.do(aTok, "GET", msgs+"?limit=1&cursor=1&_=1&_=2", "")
	if page := decode[listResp[messageResp]](t, b); code != 200 || len(page.Items) != 1 || page.Items[0].Seq != 2 {
		t.Fatalf("limit=1&cursor=1: %d %s", code, b)
	}
}
