package restapi

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A huge body timeout does not cut responses off: the write deadline is
// the body timeout plus the transfer allowance of the bytes written, and
// with the longest duration the sum wrapped negative once 56 KiB were
// written, the deadline landed in the past and every larger response ended
// mid-body. The sum now saturates, for requests with a body too.
func TestHugeBodyTimeoutDoesNotCutResponses(t *testing.T) {
	page := bytes.Repeat([]byte("x"), 300<<10)
	s := &Server{cfg: Config{BodyTimeout: math.MaxInt64}}
	srv := httptest.NewServer(s.deadlines(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, "body", http.StatusBadRequest)
			return
		}
		_, _ = w.Write(page)
	})))
	defer srv.Close()
	for _, body := range []io.Reader{nil, bytes.NewReader(page)} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(b) != len(page) {
			t.Fatalf("with body %v: %d, %d of %d bytes: %v", body != nil, resp.StatusCode, len(b), len(page), err)
		}
	}
}
