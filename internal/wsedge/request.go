package wsedge

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// upgradeRequest reports whether req, parsed by http.ReadRequest from
// head, is one this package serves: an HTTP/1.1 GET of path with one valid
// Host, a WebSocket upgrade, no body, no Expect, and header names and
// values that net/http's server would accept. net/http answers every other
// request.
func upgradeRequest(req *http.Request, head []byte, path string) bool {
	if req.Method != http.MethodGet || req.ProtoMajor != 1 || req.ProtoMinor != 1 ||
		req.URL.Path != path || req.URL.RawPath != "" || req.URL.Host != "" {
		return false
	}
	if req.ContentLength != 0 || len(req.TransferEncoding) != 0 ||
		req.Header["Content-Length"] != nil || req.Header["Transfer-Encoding"] != nil || req.Header["Expect"] != nil {
		return false
	}
	// http.ReadRequest keeps the first Host in req.Host and drops the
	// header: count them in the text.
	if hostLines(head) != 1 || !validHost(req.Host) {
		return false
	}
	for k, vs := range req.Header {
		if !validName(k) {
			return false
		}
		for _, v := range vs {
			if !validValue(v) {
				return false
			}
		}
	}
	return hasToken(req.Header["Upgrade"], "websocket") && hasToken(req.Header["Connection"], "upgrade")
}

// hostLines counts the header lines of head named Host.
func hostLines(head []byte) int {
	n := 0
	for line := range bytes.SplitSeq(head, []byte("\r\n")) {
		if len(line) >= 5 && bytes.EqualFold(line[:5], []byte("host:")) {
			n++
		}
	}
	return n
}

// hasToken reports whether one of the comma-separated lists in vs holds
// token (case-insensitive).
func hasToken(vs []string, token string) bool {
	for _, v := range vs {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// validName: an RFC 9110 token.
func validName(s string) bool { return alnumOr(s, "!#$%&'*+-.^_`|~") }

// validHost: a host name, IPv4 or bracketed IPv6 address, with an optional
// port; nothing net/http's server would refuse.
func validHost(s string) bool { return alnumOr(s, "-._:[]") }

// alnumOr reports whether s is not empty and each of its bytes is an ASCII
// letter or digit or one of extra.
func alnumOr(s, extra string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(extra, c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// validValue: no control byte but a tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// maxBody bounds the answer of a handler that does not hijack (an error
// before the upgrade: a few hundred bytes).
const maxBody = 64 << 10

// response is the http.ResponseWriter of a request served here. A handler
// that hijacks gets the connection with nothing read past the request; an
// answer without a hijack is collected and written by finish, with
// Connection: close.
type response struct {
	conn     net.Conn
	header   http.Header
	status   int
	body     []byte
	hijacked bool
}

func (w *response) Header() http.Header { return w.header }

// WriteHeader records the status; informational ones other than 101 are
// not sent.
func (w *response) WriteHeader(code int) {
	if w.hijacked || w.status != 0 || code < 100 || code > 999 {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	w.status = code
}

func (w *response) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if len(w.body)+len(p) > maxBody {
		return 0, http.ErrContentLength
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// Hijack hands over the connection; a status written before goes out
// first, with the header (as net/http does).
func (w *response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.hijacked = true
	if err := w.conn.SetDeadline(time.Time{}); err != nil {
		return nil, nil, err
	}
	if w.status != 0 {
		if _, err := w.conn.Write(w.head(false)); err != nil {
			return nil, nil, err
		}
	}
	return w.conn, bufio.NewReadWriter(bufio.NewReaderSize(w.conn, 16), bufio.NewWriterSize(w.conn, 16)), nil
}

// SetReadDeadline and SetWriteDeadline serve http.ResponseController.
func (w *response) SetReadDeadline(t time.Time) error  { return w.conn.SetReadDeadline(t) }
func (w *response) SetWriteDeadline(t time.Time) error { return w.conn.SetWriteDeadline(t) }

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// head is the status line and header; final adds Connection: close, Date,
// and the body's length and type.
func (w *response) head(final bool) []byte {
	if final {
		h := w.header
		h.Set("Connection", "close")
		if h.Get("Date") == "" {
			h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
		}
		if bodyAllowed(w.status) {
			h.Set("Content-Length", strconv.Itoa(len(w.body)))
			if len(w.body) > 0 && h.Get("Content-Type") == "" {
				h.Set("Content-Type", http.DetectContentType(w.body))
			}
		} else {
			h.Del("Content-Length")
		}
	}
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 " + strconv.Itoa(w.status) + " " + http.StatusText(w.status) + "\r\n")
	_ = w.header.Write(&b) // sorted; line breaks in values become spaces
	b.WriteString("\r\n")
	return b.Bytes()
}

// finishTimeout bounds writing an answer and waiting for the client to
// take it.
const finishTimeout = 5 * time.Second

// finish writes the answer of a handler that did not hijack and closes
// the connection: the write side first, then, after the client's end or
// half a second, the rest, so an answer is not lost to a reset when the
// client sent more than was read.
func (w *response) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	c := w.conn
	defer c.Close()
	if err := c.SetWriteDeadline(time.Now().Add(finishTimeout)); err != nil {
		return
	}
	b := w.head(true)
	if bodyAllowed(w.status) {
		b = append(b, w.body...)
	}
	if _, err := c.Write(b); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		var sink [512]byte
		for n := 0; n < 64<<10; {
			m, err := c.Read(sink[:])
			n += m
			if err != nil {
				break
			}
		}
	}
}
