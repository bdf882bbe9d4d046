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
		// A seq is digits only: ParseInt would take a sign. Both
		// parameters at once are refused even when one is empty.
		{msgs + "?afterSeq=%2B1", "invalid_cursor"},
		{msgs + "?cursor=%2B1", "invalid_cursor"},
		{msgs + "?afterSeq=-0", "invalid_cursor"},
		{msgs + "?cursor=-0", "invalid_cursor"},
		{msgs + "?afterSeq=&cursor=1", "invalid_cursor"},
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

// The project listings follow the same rule (limit: invalid_limit; cursor:
// invalid_cursor when given twice), and a limit is digits only: a sign,
// which strconv would take, is invalid_limit on every listing; a leading
// zero is the same number, taken on every listing.
func TestProjectListingsRefuseRepeatedPagingParameters(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "t")
	sub := h.qSub(p, top.ID, "s")
	h.qPublish(p, top.ID, "e1", `{"a":1}`)
	h.putKV(p, "k1", "v1", 3600)
	_, aTok := h.user()
	for _, c := range []struct{ path, code string }{
		{p.path("/cache?cursor=&cursor="), "invalid_cursor"},
		{p.path("/cache?limit=5&limit=x"), "invalid_limit"},
		{p.path("/cache?limit=%2B5"), "invalid_limit"},
		{p.path("/topics/" + top.ID + "/messages?cursor=a&cursor=b"), "invalid_cursor"},
		{p.path("/topics/" + top.ID + "/messages?limit=5&limit=5"), "invalid_limit"},
		{p.path("/topics/" + top.ID + "/messages?limit=-1"), "invalid_limit"},
		{p.path("/subscriptions/" + sub.ID + "/receipts?cursor=&cursor="), "invalid_cursor"},
		{p.path("/subscriptions/" + sub.ID + "/receipts?limit=%2B1"), "invalid_limit"},
	} {
		code, b := h.do(p.read, "GET", c.path, "")
		wantError(t, code, b, 400, c.code)
	}
	code, b := h.do(aTok, "GET", "/v1/dialogs?limit=%2B1", "")
	wantError(t, code, b, 400, "invalid_limit")
	// Once each, as before.
	if code, b := h.do(p.read, "GET", p.path("/cache?limit=5"), ""); code != 200 {
		t.Fatalf("cache?limit=5: %d %s", code, b)
	}
	if code, b := h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages?limit=05"), ""); code != 200 {
		t.Fatalf("messages?limit=05: %d %s", code, b)
	}
}
