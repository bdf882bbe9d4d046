package restapi_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
)

// headAndGet asks path with HEAD, then with GET, and returns both answers
// (the GET's body read).
func headAndGet(t *testing.T, h *harness, tok, path string) (head, get *http.Response, getBody []byte) {
	t.Helper()
	for _, m := range []string{"HEAD", "GET"} {
		req, _ := http.NewRequest(m, h.srv.URL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m == "HEAD" {
			if len(b) != 0 {
				t.Errorf("HEAD %s: %d bytes of body", path, len(b))
			}
			head = resp
		} else {
			get, getBody = resp, b
		}
	}
	return head, get, getBody
}

// Every route that answers GET answers HEAD the same way without the body
// (load balancers and uptime monitors probe /healthz and /readyz with
// HEAD, and they answered 405): the same status, Content-Type,
// Cache-Control and Content-Length as the GET, errors included. A method
// mismatch names HEAD in Allow beside GET.
func TestHeadIsServedWhereverGetIs(t *testing.T) {
	h := newHarness(t)
	_, tok := h.user()
	bob, _ := h.user()
	d := h.dialog(tok, bob)
	h.send(tok, d.ID, `{"body":"hello"}`)

	full := h.server(io.Discard, func(dp *restapi.Deps) {
		dp.Redis, dp.Realtime = h.rdb, h.rt
		dp.Gateway = routesOnlyGateway{}
	})
	served := servedRoutes(t, full.api)
	gets := 0
	for label := range served {
		if tpl, ok := strings.CutPrefix(label, "GET "); ok {
			gets++
			if !served["HEAD "+tpl] {
				t.Errorf("%s is served, HEAD %s is not", label, tpl)
			}
		}
	}
	if gets < 10 {
		t.Fatalf("the router walk found only %d GET routes: %v", gets, served)
	}

	pid := ids.New()
	for _, c := range []struct {
		path      string
		tok       string
		status    int
		sameBytes bool // the GET's body is the same on every call
	}{
		{"/healthz", "", 200, true},
		{"/readyz", "", 200, false},
		{"/metrics", "", 200, false},
		{"/v1/public/config", "", 200, true},
		{"/v1/openapi.json", "", 200, true},
		{"/v1/me", tok, 200, true},
		{"/v1/me", "", 401, true},
		{"/v1/dialogs", tok, 200, true},
		{"/v1/dialogs?limit=0", tok, 400, true},
		{"/v1/dialogs/" + d.ID + "/messages", tok, 200, true},
		{"/v1/dialogs/" + ids.New() + "/messages", tok, 404, true},
		{"/v1/attachments/" + ids.New() + "/download-url", tok, 404, true},
		{"/projects/" + pid + "/redis", tok, 404, true},
		{"/projects/" + pid + "/redis/cache", tok, 404, true},
	} {
		head, get, body := headAndGet(t, h, c.tok, c.path)
		if head.StatusCode != c.status || get.StatusCode != c.status {
			t.Errorf("%s: HEAD %d, GET %d, want %d", c.path, head.StatusCode, get.StatusCode, c.status)
			continue
		}
		for _, k := range []string{"Content-Type", "Cache-Control", "Allow"} {
			if head.Header.Get(k) != get.Header.Get(k) {
				t.Errorf("%s: %s of HEAD %q, of GET %q", c.path, k, head.Header.Get(k), get.Header.Get(k))
			}
		}
		if c.sameBytes && (head.ContentLength != int64(len(body)) || head.Header.Get("Content-Length") != get.Header.Get("Content-Length")) {
			t.Errorf("%s: Content-Length of HEAD %q, of GET %q (%d bytes)", c.path,
				head.Header.Get("Content-Length"), get.Header.Get("Content-Length"), len(body))
		}
	}

	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/me"},
		{"DELETE", "/v1/dialogs"},
		{"PUT", "/v1/dialogs/" + d.ID + "/messages"},
		{"POST", "/healthz"},
		{"DELETE", "/projects/" + pid + "/redis"},
	} {
		code, b, hdr := h.doH(tok, c.method, c.path, "", nil)
		allow := strings.Split(hdr.Get("Allow"), ", ")
		if code != 405 || !slices.Contains(allow, "GET") || !slices.Contains(allow, "HEAD") {
			t.Errorf("%s %s: %d %s, Allow %q; want 405 naming GET and HEAD", c.method, c.path, code, b, allow)
		}
	}
}

// A HEAD spends the limit of its route's GET: a client cannot add a second
// allowance by asking with HEAD, and a HEAD past the GET's limit is 429.
func TestHeadSpendsTheLimitOfItsGet(t *testing.T) {
	base := newHarness(t)
	_, tok := base.user()
	l := newLimited(t, base, nil, map[string]ratelimit.Policy{
		"GET /v1/me": {Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FallbackLocal,
			Rules: []ratelimit.Rule{userRule(3, time.Minute)}},
	}, 0)
	for i, m := range []string{"HEAD", "GET", "HEAD"} {
		code, _, hdr := l.doH(tok, m, "/v1/me", "", nil)
		if code != 200 || !strings.HasPrefix(hdr.Get("RateLimit"), fmt.Sprintf(`"user";r=%d;`, 2-i)) {
			t.Fatalf("%s /v1/me, request %d: %d, RateLimit %q", m, i, code, hdr.Get("RateLimit"))
		}
	}
	for _, m := range []string{"GET", "HEAD"} {
		code, _, hdr := l.doH(tok, m, "/v1/me", "", nil)
		if code != 429 || hdr.Get("Retry-After") == "" {
			t.Fatalf("%s /v1/me past the limit: %d, Retry-After %q", m, code, hdr.Get("Retry-After"))
		}
	}
	if d := l.decision("GET /v1/me"); d.Allowed {
		t.Fatalf("the last decision on GET /v1/me: %+v, want the HEAD denied under it", d)
	}
}
