package restapi_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// A client that joins a base URL ending in "/" with "/v1/…" sends
// "//v1/…". A request to an API path that is not in its canonical form
// (a doubled slash, a "." or ".." segment, plain or percent-encoded) is
// answered 404 not_found in JSON and never redirected: HTTP clients follow
// a 301 of a POST with a GET, so a send would become a read of the history,
// answered 200, with nothing stored.
func TestNonCanonicalAPIPathsAreNotFoundNotRedirected(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)

	for _, c := range []struct{ method, path, body string }{
		{"POST", "//v1/dialogs/" + d.ID + "/messages", `{"body":"lost"}`},
		{"POST", "/v1//dialogs/" + d.ID + "/messages", `{"body":"lost"}`},
		{"POST", "/v1/dialogs/./" + d.ID + "/messages", `{"body":"lost"}`},
		{"POST", "/v1/x/../dialogs/" + d.ID + "/messages", `{"body":"lost"}`},
		{"POST", "/v1/x/%2e%2e/dialogs/" + d.ID + "/messages", `{"body":"lost"}`},
		{"POST", "//v1/dialogs", fmt.Sprintf(`{"memberIds":[%q]}`, bob)},
		{"GET", "//v1/dialogs", ""},
		{"DELETE", "/v1//me", ""},
		{"GET", "/healthz/", ""}, // a trailing slash is no route either
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			code, b, hdr := h.doH(aTok, c.method, c.path, c.body, idemKey())
			wantError(t, code, b, http.StatusNotFound, "not_found")
			if loc := hdr.Get("Location"); loc != "" {
				t.Fatalf("redirected to %q", loc)
			}
		})
	}
	if n := h.count(`SELECT count(*) FROM messages WHERE dialog_id = $1`, d.ID); n != 0 {
		t.Fatalf("%d messages stored by requests answered 404", n)
	}
	if n := h.count(`SELECT count(*) FROM dialogs d JOIN dialog_members m ON m.dialog_id = d.id WHERE m.user_id = $1`, bob); n != 1 {
		t.Fatalf("bob is in %d dialogs, want the 1 created before", n)
	}

	// The web client's pages outside the API keep the usual redirect of a
	// GET to the canonical path (no web client is mounted here: only the
	// redirect is checked).
	req, _ := http.NewRequest("GET", h.srv.URL+"//app/x/../index.html", nil)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/app/index.html" {
		t.Fatalf("GET //app/x/../index.html: %d Location %q, want 301 to /app/index.html", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// OPTIONS, answered before the router for CORS preflights, follows the
// same rule: a path with a "." or ".." segment (plain or percent-encoded)
// or a doubled slash is 404 not_found, not a 204 whose preflight would let
// a page send the request (every such request is 404 anyway).
func TestOptionsOfANonCanonicalAPIPathIsNotFound(t *testing.T) {
	const origin = "https://app.example"
	base := newHarness(t)
	h := base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime = base.rdb, base.rt
		d.Config.CORSOrigins = []string{origin}
	})
	preflight := map[string]string{"Origin": origin, "Access-Control-Request-Method": "POST"}
	id := ids.New()
	for _, p := range []string{
		"/v1/dialogs/../messages", "/v1/dialogs/./messages", "/v1/dialogs/%2e%2e/messages",
		"/v1/dialogs/" + id + "/./messages", "/v1/x/../dialogs", "/v1/./me", "//v1/dialogs", "/v1//dialogs",
	} {
		code, b, hdr := h.doH("", "OPTIONS", p, "", preflight)
		if code != http.StatusNotFound || string(b) != `{"error":"not_found"}` || hdr.Get("Access-Control-Allow-Methods") != "" {
			t.Errorf("OPTIONS %s: %d %s, Allow-Methods %q; want 404 not_found and no preflight", p, code, b, hdr.Get("Access-Control-Allow-Methods"))
		}
	}
	// The canonical paths still answer the preflight.
	for _, p := range []string{"/v1/dialogs/" + id + "/messages", "/v1/dialogs", "/v1/me"} {
		code, b, hdr := h.doH("", "OPTIONS", p, "", preflight)
		if code != http.StatusNoContent || len(b) != 0 || hdr.Get("Access-Control-Allow-Origin") != origin {
			t.Errorf("OPTIONS %s: %d %s, Allow-Origin %q; want the 204 preflight", p, code, b, hdr.Get("Access-Control-Allow-Origin"))
		}
	}
}
