package restapi_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/han-app/gateway/restapi"
)

// pacedBody hands out its bytes piece bytes per read, then fails with
// stall (nil: io.EOF at the end). Each read records how much room the
// reader was offered next to how much it had been given before: the
// server's buffer for the body is exactly what it has received plus that
// room.
type pacedBody struct {
	data  []byte
	piece int
	stall error
	sent  int
	reads []pacedRead
}

type pacedRead struct{ received, room int }

func (b *pacedBody) Read(p []byte) (int, error) {
	b.reads = append(b.reads, pacedRead{b.sent, len(p)})
	if b.sent == len(b.data) {
		if b.stall != nil {
			return 0, b.stall
		}
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), b.piece)], b.data[b.sent:])
	b.sent += n
	return n, nil
}

func readPaced(t *testing.T, body *pacedBody, declared, limit int64) ([]byte, error) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/dialogs", io.NopCloser(body))
	req.ContentLength = declared
	return restapi.ReadBody(httptest.NewRecorder(), req, limit)
}

// The memory a request body holds follows the bytes received, not the
// length the client declared. A client that declares 64 KiB, sends one
// byte and stalls (until the body deadline ends it) holds at most 4 KiB
// of the server's memory, so stalled connections of one address cannot
// pin 64 KiB each. A body that does arrive is read whole, into a buffer
// never more than twice what came (and never past the declared length).
func TestBodyBufferFollowsTheBytesReceived(t *testing.T) {
	t.Run("declared 64 KiB, one byte sent, then a stall", func(t *testing.T) {
		body := &pacedBody{data: []byte("{"), piece: 1, stall: os.ErrDeadlineExceeded}
		if _, err := readPaced(t, body, restapi.ChatBodyLimit, restapi.ChatBodyLimit); err == nil {
			t.Fatal("a stalled body was read without an error")
		}
		for _, rd := range body.reads {
			if rd.received+rd.room > 4<<10 {
				t.Fatalf("after %d bytes received the body buffer holds %d bytes, want at most 4 KiB", rd.received, rd.received+rd.room)
			}
		}
	})
	for _, c := range []struct {
		name     string
		size     int
		declared bool
		piece    int
	}{
		{"64 KiB declared, in 1000-byte pieces", restapi.ChatBodyLimit, true, 1000},
		{"64 KiB declared, at once", restapi.ChatBodyLimit, true, restapi.ChatBodyLimit},
		{"10,000 bytes declared, one byte at a time", 10000, true, 1},
		{"empty", 0, true, 1},
		{"chunked 64 KiB", restapi.ChatBodyLimit, false, 1000},
		{"chunked 100 bytes", 100, false, 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("abcdefg"), c.size/7+1)[:c.size]
			body := &pacedBody{data: data, piece: c.piece}
			declared := int64(-1)
			if c.declared {
				declared = int64(c.size)
			}
			got, err := readPaced(t, body, declared, restapi.ChatBodyLimit)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read %d of %d bytes: %v", len(got), len(data), err)
			}
			for _, rd := range body.reads {
				held := rd.received + rd.room
				if held > max(4<<10, 2*rd.received) || c.declared && held > c.size+1 {
					t.Fatalf("after %d bytes received (of %d) the body buffer holds %d bytes", rd.received, c.size, held)
				}
			}
		})
	}
	t.Run("chunked past the limit", func(t *testing.T) {
		body := &pacedBody{data: make([]byte, restapi.ChatBodyLimit+1), piece: 4096}
		if _, err := readPaced(t, body, -1, restapi.ChatBodyLimit); !errors.Is(err, restapi.ErrPayloadTooLarge) {
			t.Fatalf("a chunked body over the limit: %v, want payload_too_large", err)
		}
	})
}
