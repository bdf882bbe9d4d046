package restapi_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// dependencyErrors returns the han_dependency_errors_total lines of h's
// /metrics.
func (h *prjHarness) dependencyErrors() string {
	h.t.Helper()
	_, m := h.do("", "GET", "/metrics", "")
	var out []string
	for _, l := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(l, "han_dependency_errors_total{") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// failingWriter is a client that stops reading once the status line is
// out: every body write fails.
type failingWriter struct {
	*httptest.ResponseRecorder
}

func (w failingWriter) Write([]byte) (int, error) { return 0, errors.New("client gone") }

// A client that stops reading a cache listing midway cuts the response, but
// it is not a Redis failure: no dependency error is counted and nothing is
// logged as a Redis problem.
func TestCacheListingCutByTheClientIsNoRedisFailure(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	big := strings.Repeat("x", 40<<10)
	for i := range 4 { // more than the stream's 64 KiB buffer
		h.putKV(p, fmt.Sprintf("k%d", i), big, 3600)
	}
	before := h.dependencyErrors()
	req := httptest.NewRequest("GET", p.path("/cache"), nil)
	req.Header.Set("Authorization", "Bearer "+p.read)
	w := failingWriter{httptest.NewRecorder()}
	func() {
		defer func() {
			if r := recover(); r != nil && r != http.ErrAbortHandler {
				panic(r)
			}
		}()
		h.api.Handler().ServeHTTP(w, req)
	}()
	if w.Code != 200 {
		t.Fatalf("listing: status %d, want 200 before the cut", w.Code)
	}
	if after := h.dependencyErrors(); after != before {
		t.Fatalf("a client that stopped reading was counted as a Redis failure: before [%s], after [%s]", before, after)
	}
	if strings.Contains(h.logs.String(), "project cache listing aborted") {
		t.Fatal("a client that stopped reading was logged as an aborted listing")
	}
}
