package restapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawExchange writes req on a fresh connection to the harness's server and
// returns the responses the server sends, up to max, before it closes the
// connection (or before 3 s pass with nothing more).
func rawExchange(t *testing.T, h *harness, req string, max int) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	var out []*http.Response
	for len(out) < max {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp)
	}
	return out
}

// A request with both Transfer-Encoding: chunked and Content-Length is the
// classic request-smuggling shape: a proxy that frames the body by the
// length and this server, which frames it by the chunks (net/http drops the
// length), would disagree where the next request starts. The server must
// answer it and close the connection, so whatever the client sent after it
// is never read as a request. Chunked requests without a length get the same
// (the two cannot be told apart after parsing); ordinary keep-alive stays.
func TestChunkedRequestEndsTheConnection(t *testing.T) {
	h := newHarness(t)
	_, tok := h.user()
	bob, _ := h.user()
	body := fmt.Sprintf(`{"memberIds":[%q]}`, bob)
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	next := "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	head := "POST /v1/dialogs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok + "\r\nContent-Type: application/json\r\n"

	cases := []struct {
		name, req string
		closes    bool
	}{
		{"chunked with a content length", head + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + next, true},
		{"chunked", head + "Transfer-Encoding: chunked\r\n\r\n" + chunked + next, true},
		{"content length (keep-alive)", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body + next, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := rawExchange(t, h, tc.req, 2)
			if len(got) == 0 {
				t.Fatal("no answer")
			}
			if got[0].StatusCode != http.StatusCreated {
				t.Fatalf("first request: status %d, want 201 (the body is read by its chunks)", got[0].StatusCode)
			}
			if tc.closes {
				if !got[0].Close {
					t.Fatalf("the answer does not carry Connection: close (header %v)", got[0].Header)
				}
				if len(got) != 1 {
					t.Fatalf("%d answers: what followed the chunked request was served as a request", len(got))
				}
				return
			}
			if got[0].Close || len(got) != 2 || got[1].StatusCode != http.StatusOK {
				t.Fatalf("keep-alive broken: %d answers, first closes %v", len(got), got[0].Close)
			}
		})
	}
}
