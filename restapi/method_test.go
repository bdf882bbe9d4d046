package restapi_test

import "testing"

func TestWrongMethodIs405(t *testing.T) {
	h := newHarness(t)
	_, tok := h.user()
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/me"},
		{"DELETE", "/v1/dialogs"},
		{"PUT", "/v1/dialogs/00000000-0000-7000-8000-000000000001/messages"},
		{"POST", "/healthz"},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			code, b := h.do(tok, c.method, c.path, "")
			wantError(t, code, b, 405, "method_not_allowed")
		})
	}
	code, b := h.do(tok, "GET", "/v1/nowhere", "")
	wantError(t, code, b, 404, "not_found")
}
