package restapi_test

import (
	"fmt"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// An answer of an authenticated route is one caller's data: every one of
// them, successes and replays included, carries Cache-Control: no-store,
// so neither a shared cache nor the browser's disk cache keeps a user's
// dialogs, messages, attachment URLs or project values. The public
// description stays cacheable.
func TestAuthenticatedAnswersAreNotStored(t *testing.T) {
	h := newHarness(t)
	ph := h.projectServer(h.rdb, env.Redis)
	_, tok := h.user()
	bob, _ := h.user()
	d := h.dialog(tok, bob)
	att := h.uploadedAttachment(tok, d.ID)
	p := ph.project()
	sendKey := idemKey()
	send := fmt.Sprintf(`{"body":"hi","clientMessageId":%q}`, ids.New())

	for _, c := range []struct {
		h                       *harness
		tok, method, path, body string
		hdr                     map[string]string
		status                  int
	}{
		{h, tok, "GET", "/v1/me", "", nil, 200},
		{h, tok, "HEAD", "/v1/me", "", nil, 200},
		{h, tok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q]}`, bob), nil, 201},
		{h, tok, "GET", "/v1/dialogs", "", nil, 200},
		{h, tok, "POST", "/v1/dialogs/" + d.ID + "/messages", send, sendKey, 201},
		{h, tok, "POST", "/v1/dialogs/" + d.ID + "/messages", send, sendKey, 201}, // the replay
		{h, tok, "GET", "/v1/dialogs/" + d.ID + "/messages", "", nil, 200},
		{h, tok, "POST", "/v1/attachments", fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, d.ID), idemKey(), 201},
		{h, tok, "GET", "/v1/attachments/" + att.ID + "/download-url", "", nil, 200},
		{h, h.serviceToken("billing"), "POST", "/v1/internal/inbox",
			fmt.Sprintf(`{"id":%q,"kind":"invoice.paid","dialogId":%q,"data":{}}`, "inv-"+ids.New(), d.ID), nil, 201},
		{ph.harness, p.read, "GET", p.path(""), "", nil, 200},
		{ph.harness, p.write, "PUT", p.path("/cache"), `{"key":"k","type":"string","value":"v","ttlSeconds":60}`, nil, 201},
		{ph.harness, p.read, "GET", p.path("/cache"), "", nil, 200},
		{h, tok, "GET", "/v1/dialogs?limit=0", "", nil, 400},
		{h, "", "GET", "/v1/dialogs", "", nil, 401},
	} {
		code, b, hdr := c.h.doH(c.tok, c.method, c.path, c.body, c.hdr)
		if code != c.status || hdr.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: %d %.200s, Cache-Control %q; want %d with no-store", c.method, c.path, code, b, hdr.Get("Cache-Control"), c.status)
		}
	}

	if code, _, hdr := h.doH("", "GET", "/v1/openapi.json", "", nil); code != 200 || hdr.Get("Cache-Control") != "public, max-age=300" {
		t.Errorf("GET /v1/openapi.json: %d, Cache-Control %q; the public description stays cacheable", code, hdr.Get("Cache-Control"))
	}
}
