package restapi

import (
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// MinTransferRate is the slowest a request body may arrive and a response
// may leave (bytes per second), after the base time Config.BodyTimeout. A
// client slower than this holds a descriptor for nothing, and thousands of
// them exhaust the process.
const MinTransferRate = 64 << 10

// transferTime is how long n bytes may take at MinTransferRate.
func transferTime(n int64) time.Duration {
	const most = 1 << 40 // keeps the product far from overflowing
	return time.Duration(min(n, most)) * time.Second / MinTransferRate
}

// allowance is base + transferTime(n), at most the longest duration: a
// huge base (HAN_HTTP_BODY_TIMEOUT is bounded by the configuration, the
// Config field is not) must not wrap the sum negative, which put the
// deadline in the past and cut responses off mid-body.
func allowance(base time.Duration, n int64) time.Duration {
	t := transferTime(n)
	if base > math.MaxInt64-t {
		return math.MaxInt64
	}
	return base + t
}

// deadlines bounds the socket time of every request it wraps:
//   - a body must keep arriving: each read of it must end by
//     start + BodyTimeout + the bytes received so far at MinTransferRate
//     (so a body of known length is read by start + BodyTimeout +
//     Content-Length at MinTransferRate at the latest), and never later
//     than BodyTimeout after the read began. A client that sends nothing,
//     stops, or trickles a byte now and then is cut off within
//     BodyTimeout, instead of holding its connection, and whatever the
//     handler holds for it, for the whole allowance of the length it
//     declared (over 400 s for 25 MiB). A client that keeps up
//     MinTransferRate on average is never cut off;
//   - the response is written by first write + BodyTimeout + bytes written
//     at MinTransferRate, extended as bytes go out, so a client that stops
//     reading is cut off once the kernel buffers are full;
//   - an error answered before the body was read closes the connection
//     (Connection: close) and the body is never read: net/http would
//     otherwise read up to 256 KiB of it before or after the answer.
//
// Requests without a body get no read deadline: net/http reads such a
// connection in the background while the handler runs, and a deadline
// there would cancel the request. For the same reason a body read to its
// end leaves the read deadline at the allowance of its whole length, not
// BodyTimeout after its last byte: net/http's background read starts
// there, and the handler's work after the body keeps the time it always
// had. A WebSocket upgrade inherits nothing: the 101 is informational (no
// deadline armed) and net/http clears both deadlines when the connection
// is hijacked.
func (s *Server) deadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if len(r.TransferEncoding) > 0 {
			// A chunked request may also have carried a Content-Length,
			// which net/http drops without a trace. A proxy in front that
			// framed the body by that length would read the next request
			// elsewhere on this connection than we do, so the connection
			// ends with this answer, as HTTP/1.1 requires of a server given
			// both; since the two cannot be told apart here, every chunked
			// request gets it.
			w.Header().Set("Connection", "close")
		}
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), base: s.cfg.BodyTimeout}
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			b := &deadlineBody{ReadCloser: r.Body, rc: dw.rc, start: start, base: dw.base}
			_ = dw.rc.SetReadDeadline(start.Add(dw.base))
			dw.body = b
			r.Body = b
		}
		next.ServeHTTP(dw, r)
	})
}

// deadlineBody sets the read deadline before each read of the body (see
// deadlines) and records whether the body was read to its end.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	base  time.Duration
	read  int64
	eof   atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.eof.Load() {
		return b.ReadCloser.Read(p)
	}
	// The deadline is set when a read starts, so the time a handler spends
	// between reads (a database call, a disk write) never counts as the
	// client's silence.
	_ = b.rc.SetReadDeadline(b.deadline(time.Now()))
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if err == io.EOF {
		b.eof.Store(true)
		_ = b.rc.SetReadDeadline(b.start.Add(allowance(b.base, b.read)))
	}
	return n, err
}

// deadline is when a read that starts at now must end: the allowance of
// the bytes received so far, and no more than BodyTimeout of silence.
func (b *deadlineBody) deadline(now time.Time) time.Time {
	d := b.start.Add(allowance(b.base, b.read))
	if idle := now.Add(b.base); idle.Before(d) {
		return idle
	}
	return d
}

type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	base    time.Duration
	body    *deadlineBody // nil: the request has no body
	t0      time.Time     // first byte of the answer; zero: not yet
	written int64
}

// Unwrap lets http.ResponseController (and the WebSocket upgrade) reach the
// underlying writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *deadlineWriter) WriteHeader(code int) {
	if code >= 200 && w.t0.IsZero() {
		w.arm(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

// writeChunk bounds how many bytes one deadline covers, so a large write
// of a client that stopped reading fails after the bytes it took.
const writeChunk = 32 << 10

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if w.t0.IsZero() {
		w.arm(http.StatusOK)
	}
	total := 0
	for len(p) > 0 {
		c := p[:min(len(p), writeChunk)]
		_ = w.rc.SetWriteDeadline(w.t0.Add(allowance(w.base, w.written+int64(len(c)))))
		n, err := w.ResponseWriter.Write(c)
		total += n
		w.written += int64(n)
		if err != nil {
			return total, err
		}
		p = p[len(c):]
	}
	return total, nil
}

// arm starts the response clock; an error answered while the request body
// is unread gives up on the body.
func (w *deadlineWriter) arm(code int) {
	w.t0 = time.Now()
	_ = w.rc.SetWriteDeadline(w.t0.Add(w.base))
	if code >= 400 && w.body != nil && !w.body.eof.Load() {
		closeUnread(w.ResponseWriter)
		// A read deadline in the past makes net/http's own attempt to read
		// the rest (after the handler) fail at once.
		_ = w.rc.SetReadDeadline(time.Now())
	}
}

// closeUnread asks net/http to close the connection after this answer the
// way it does when http.MaxBytesReader passes its limit: Connection: close,
// then a half-close and a short wait before the socket closes, so a client
// still sending its body reads the answer before the kernel resets the
// connection over the unread bytes. An exhausted MaxBytesReader over an
// empty limit is what triggers it; nothing of the request is read.
func closeUnread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_, _ = http.MaxBytesReader(w, io.NopCloser(strings.NewReader("x")), 0).Read(make([]byte, 1))
}

// bodyReadError maps a failure while reading a request body: the body read
// deadline → 408 request_timeout, anything else (the client went away, a
// malformed chunked encoding) → 400 invalid_body_stream.
func bodyReadError(err error) *Error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errRequestTimeout
	}
	return apiErr(http.StatusBadRequest, "invalid_body_stream")
}
