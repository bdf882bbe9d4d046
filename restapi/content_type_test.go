package restapi_test

import (
	"testing"
)

// A body is read as JSON only under a Content-Type that says JSON in UTF-8.
// A type that merely begins with application/json, or another charset, is
// 415 unsupported_media_type and nothing is written: reading latin-1 bytes
// as UTF-8 would store other text than the client sent. Chat and the
// project API answer alike.
func TestContentTypeMustBeJSONInUTF8(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	for _, ct := range []string{"application/jsonx", "application/json-seq", "application/json; charset=latin1", "application/json; charset=utf-16"} {
		code, b, _ := h.doH(aTok, "POST", path, `{"body":"caf\u00e9"}`, map[string]string{"Content-Type": ct, "Idempotency-Key": "ct-" + ct})
		wantError(t, code, b, 415, "unsupported_media_type")
	}
	if n := h.count("SELECT count(*) FROM messages WHERE dialog_id=$1", d.ID); n != 0 {
		t.Fatalf("%d messages stored from refused bodies", n)
	}
	code, b, _ := h.doH(aTok, "POST", path, `{"body":"caf\u00e9"}`, map[string]string{"Content-Type": "application/json; charset=UTF-8", "Idempotency-Key": "ct-utf8"})
	if code != 201 {
		t.Fatalf("application/json; charset=UTF-8: %d %s", code, b)
	}

	ph := newPrjHarness(t)
	t.Run("project", func(t *testing.T) {
		defer ph.as(t)()
		p := ph.project()
		code, b, _ := ph.doH(p.write, "PUT", p.path("/cache"), `{"key":"a","type":"string","value":"v"}`, map[string]string{"Content-Type": "application/jsonx"})
		wantError(t, code, b, 415, "unsupported_media_type")
		if got := ph.list(p.read, p, ""); len(got.Items) != 0 {
			t.Fatalf("a refused body was stored: %+v", got.Items)
		}
	})
}
