package restapi_test

import (
	"fmt"
	"strings"
	"testing"
)

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

// net/http takes any token as a method, and a request with one reaches the
// metrics and the access log without a token (it is answered 405 or 404).
// Every method outside the standard set is counted and logged as "other":
// inventing methods adds no series to han_http_requests_total and no long
// field to the log.
func TestInventedMethodsShareOneMetricSeries(t *testing.T) {
	h, logs := newHarness(t).withLog(nil)
	invented := []string{"get", "PROPFIND", strings.Repeat("X", 4<<10)}
	for i := range 20 {
		invented = append(invented, fmt.Sprintf("INVENTED%d", i))
	}
	for _, m := range invented {
		code, b := h.do("", m, "/v1/dialogs", "")
		if code != 404 && code != 405 {
			t.Fatalf("%.20s /v1/dialogs: %d %s", m, code, b)
		}
	}
	if code, _ := h.do("", "GET", "/healthz", ""); code != 200 {
		t.Fatalf("GET /healthz: %d", code)
	}

	code, b := h.do("", "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	methods := map[string]int{} // han_http_requests_total by method
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "han_http_requests_total{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `method="`)
		m, _, _ := strings.Cut(rest, `"`)
		var n int
		fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &n)
		methods[m] += n
	}
	if methods["other"] != len(invented) || methods["GET"] == 0 || len(methods) != 2 {
		t.Fatalf("han_http_requests_total by method: %v, want GET and %d under other", methods, len(invented))
	}
	lines := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"http"`) && strings.Contains(line, `"route":"other"`) {
			lines++
			if !strings.Contains(line, `"method":"other"`) {
				t.Errorf("access log: %.200s", line)
			}
		}
	}
	if lines != len(invented) {
		t.Errorf("%d access log lines of the invented methods, want %d", lines, len(invented))
	}
}
