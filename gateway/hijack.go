package gateway

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Buffer sizes of a hijacked connection. net/http's hijack hands over a
// 4 KiB reader and a new 4 KiB writer that coder/websocket keeps for the
// connection's life; most connections are idle, so small buffers save
// memory, and the cork below batches writes so small buffers do not turn
// one frame into several syscalls.
const (
	// connReadBuf is bufio's minimum. Inbound frames are small and rare
	// (frame rate limit): a frame header comes through the buffer, and a
	// payload longer than what is left of it is read straight into the
	// caller's slice, so a frame costs two reads instead of one.
	connReadBuf    = 16
	connWriteBuf   = 128 // holds any control frame (≤ 127 bytes); data frames go through the cork
	corkFlushBytes = 32 << 10
)

// hijackWriter hands coder/websocket a hijacked connection with small
// buffers, wrapped in a corkConn. The 101 response is not written by
// net/http: it waits in the corkConn and leaves with the connection's first
// write (the hello frame, or a close frame that refuses the handshake), so
// an accepted handshake costs one write instead of two.
type hijackWriter struct {
	http.ResponseWriter
	sendBuffer int // SO_SNDBUF; 0 leaves the kernel default
	cork       *corkConn
	upgrade    bool // WriteHeader(101) was called and kept back
}

// statusRecorder is implemented by a wrapping ResponseWriter (the access
// log's) that should learn a status it did not see written.
type statusRecorder interface{ RecordStatus(code int) }

// WriteHeader keeps a 101 back for Hijack; any other status is written as
// usual.
func (w *hijackWriter) WriteHeader(code int) {
	if code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.upgrade = true
	for rw := w.ResponseWriter; rw != nil; {
		if r, ok := rw.(statusRecorder); ok {
			r.RecordStatus(code)
		}
		u, ok := rw.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		rw = u.Unwrap()
	}
}

// upgradeResponse is the 101 response with the headers set so far (values
// with a line break are left out: none of the handshake's own have one).
func upgradeResponse(h http.Header) []byte {
	b := append(make([]byte, 0, 256), "HTTP/1.1 101 Switching Protocols\r\n"...)
	for k, vs := range h {
		for _, v := range vs {
			if strings.ContainsAny(k, "\r\n:") || strings.ContainsAny(v, "\r\n") {
				continue
			}
			b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// An interface, not *net.TCPConn: the listener may wrap the TCP conn.
	if sb, ok := nc.(interface{ SetWriteBuffer(int) error }); ok && w.sendBuffer > 0 {
		_ = sb.SetWriteBuffer(w.sendBuffer)
	}
	cc := &corkConn{Conn: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			cc.raw = raw
			cc.rawWriteFn = cc.rawWrite
		}
	}
	if w.upgrade {
		cc.head = upgradeResponse(w.Header())
	}
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the client sent with or right after its upgrade request
		// (often its first frame) were read together with the request.
		// coder/websocket keeps only what the returned reader has buffered
		// and then resets it onto the returned net.Conn, so a reader
		// wrapping them would be thrown away: the connection itself serves
		// them first, and the read buffer stays small.
		b, _ := brw.Reader.Peek(n)
		cc.early = bytes.Clone(b)
	}
	w.cork = cc
	cc.br = bufio.NewReaderSize(cc, connReadBuf)
	return cc, bufio.NewReadWriter(cc.br, bufio.NewWriterSize(cc, connWriteBuf)), nil
}

// corkConn collects writes while corked and sends them in one write when
// uncorked: the writer corks around a batch of frames. Reads return the
// bytes that arrived with the upgrade request first.
type corkConn struct {
	net.Conn

	// br is the read buffer handed to coder/websocket, which reads every
	// frame through it: the reader waits on it for the next frame's first
	// byte, and frames the gateway reads itself (a client's ping or pong
	// between messages) come through it too. Only the reading side (the
	// reader, or the frame worker it waits for) touches it.
	br *bufio.Reader

	// early holds bytes read from the client before the hijack; Read
	// returns them before reading the socket. Only the connection's single
	// reader touches it.
	early []byte
	// head is the upgrade response, not yet written: the first write
	// sends it first (guarded by mu).
	head []byte

	mu     sync.Mutex // guards the fields below; held across a write so bytes never interleave
	corked bool
	sealed bool // closing: every later write goes straight out
	// batch is true from cork to uncork or discard: the write deadline set
	// by cork bounds every write of the batch, buffered or not.
	batch bool
	// armed: the socket has a write deadline, until. It is left set after
	// a batch (clearing it would be a second deadline call per batch) and
	// cleared by the first direct write outside a batch (a pong or close
	// frame coder/websocket writes, bounded by its own context). A batch
	// that finds at least its whole timeout left on it keeps it: setting a
	// deadline is a timer change in the runtime, and a busy connection
	// writes many batches per second.
	armed bool
	// closeSent: a close frame went through (coder/websocket writes each
	// control frame in one Write); no data frame may follow it.
	closeSent bool
	// broken: a write ended with an error after part of a frame went out
	// (a deadline cut a frame in two), or bytes that continue a frame on
	// the wire were dropped. The client would read the next bytes as the
	// rest of that frame, so nothing is written any more.
	broken bool
	// midFrame: the socket took only part of an inline write (tryWrite),
	// so the collected bytes start inside a frame until written whole.
	midFrame bool
	until    time.Time
	buf      *[]byte

	// raw is the socket's file descriptor access (nil when the connection
	// is not a socket): tryWrite writes through it without blocking.
	// rawWriteFn is c.rawWrite, made once (a method value allocates), and
	// rawN its result (bytes written, ≤ 0 for none; an inline write is at
	// most inlineBytes and the upgrade response); both used under mu.
	raw        syscall.RawConn
	rawWriteFn func(fd uintptr) bool
	rawN       int32
	// readLeft bounds the reads of the client frame being read
	// (limitRead): a read that takes it to zero fails, and so does every
	// read after that (-1) until endRead; 0 when no frame is being read.
	// Only the connection's reader touches it. An int32 beside rawN: the
	// two share the word rawN had, so an idle connection holds no more.
	readLeft int32
}

// First bytes of the frames the cork looks at: FIN + opcode.
const (
	frameText  = 0x81
	frameClose = 0x88
	opPing     = 0x89
	opPong     = 0x8a
)

// errDataAfterClose refuses a data frame once the connection is closing.
var errDataAfterClose = fmt.Errorf("gateway: data frame after close: %w", net.ErrClosed)

// errBroken refuses every write after one that cut a frame in two.
var errBroken = fmt.Errorf("gateway: write after a frame cut short: %w", net.ErrClosed)

// errFrameWire fails the reads of a client frame that took more bytes on
// the wire than limitRead allowed.
var errFrameWire = errors.New("gateway: client frame too long on the wire")

func (c *corkConn) Read(p []byte) (int, error) {
	if c.readLeft < 0 {
		return 0, errFrameWire
	}
	var n int
	var err error
	if len(c.early) > 0 {
		n = copy(p, c.early)
		c.early = c.early[n:]
		if len(c.early) == 0 {
			c.early = nil // let the bytes go
		}
	} else {
		n, err = c.Conn.Read(p)
	}
	if c.readLeft > 0 {
		if n >= int(c.readLeft) {
			// Nothing of this read is returned: bytes handed over with
			// the error could be taken as a whole frame (io.ReadFull
			// drops an error that comes with the last bytes it wanted).
			c.readLeft = -1
			return 0, errFrameWire
		}
		c.readLeft -= int32(n)
	}
	return n, err
}

// limitRead bounds the reads of one client frame: at most n bytes off the
// wire (its payload, its fragments' headers, control frames between
// them), all before deadline; endRead lifts both. A WebSocket message may
// come in any number of fragments, empty ones too, which coder/websocket
// reads within one Read of the message: only the socket sees them all.
func (c *corkConn) limitRead(n int, deadline time.Time) {
	c.readLeft = int32(min(n, math.MaxInt32-1) + 1)
	_ = c.Conn.SetReadDeadline(deadline) // a failure (closed) is the read's to meet
}

// endRead lifts limitRead's bounds: the reader waits for the next frame
// without a deadline.
func (c *corkConn) endRead() {
	c.readLeft = 0
	_ = c.Conn.SetReadDeadline(time.Time{})
}

var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > 0 && p[0] == frameClose {
		c.closeSent = true
	}
	if c.corked {
		*c.buf = append(*c.buf, p...)
		if c.closeSent {
			// coder/websocket answering the client's close: what is
			// collected and the close frame go out now, nothing after.
			err := c.flushLocked()
			c.release()
			c.sealed = true
			return len(p), err
		}
		return len(p), nil
	}
	if c.armed && !c.batch {
		if err := c.Conn.SetWriteDeadline(time.Time{}); err != nil {
			return 0, err
		}
		c.armed, c.until = false, time.Time{}
	}
	if c.head != nil {
		b := append(c.head, p...)
		c.head = nil
		if n, err := c.writeLocked(b); err != nil {
			return max(n-(len(b)-len(p)), 0), err
		}
		return len(p), nil
	}
	return c.writeLocked(p)
}

// writeControl sends a ping or pong frame (op, FIN set) with payload (at
// most 125 bytes): with the batch being collected when a writer has one
// open, else at once, bounded by a write deadline as a batch is
// (armLocked). Nothing goes out once closing: no frame may follow a close
// frame.
func (c *corkConn) writeControl(op byte, payload []byte, now time.Time, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sealed || c.closeSent {
		return nil
	}
	if c.corked {
		*c.buf = append(append(*c.buf, op, byte(len(payload))), payload...)
		return nil
	}
	if err := c.armLocked(now, timeout); err != nil {
		return err
	}
	b := make([]byte, 0, len(c.head)+2+len(payload))
	b = append(append(append(b, c.head...), op, byte(len(payload))), payload...)
	c.head = nil
	_, err := c.writeLocked(b)
	return err
}

// sendHead writes the upgrade response now if it has not gone out yet.
func (c *corkConn) sendHead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.head == nil || c.corked {
		return
	}
	// A fresh socket's send buffer takes these few hundred bytes at once.
	_, _ = c.writeLocked(c.head)
	c.head = nil
}

// cork starts a batch: it makes sure the socket's write deadline gives the
// whole batch at least timeout from now, and collects writes until uncork
// (unless sealed: then writes go straight out, still under the deadline).
// A deadline already set that far ahead stays; a new one is set half a
// timeout further (now + 1.5 × timeout), so a connection that writes often
// sets it about once per half timeout instead of once per batch. A batch
// that accepts nothing gets between timeout and 1.5 × timeout.
func (c *corkConn) cork(now time.Time, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batch = true
	if err := c.armLocked(now, timeout); err != nil {
		return err
	}
	if !c.corked && !c.sealed {
		c.corked = true
		c.buf = corkBufs.Get().(*[]byte)
		if c.head != nil {
			*c.buf = append(*c.buf, c.head...)
			c.head = nil
		}
	}
	return nil
}

// armLocked makes sure the socket's write deadline leaves at least timeout
// from now, setting it to now + 1.5 × timeout when less is left (see cork).
// c.mu must be held.
func (c *corkConn) armLocked(now time.Time, timeout time.Duration) error {
	if c.armed && c.until.Sub(now) >= timeout {
		return nil
	}
	until := now.Add(timeout + timeout/2)
	if err := c.Conn.SetWriteDeadline(until); err != nil {
		return err
	}
	c.armed, c.until = true, until
	return nil
}

// writeText adds one WebSocket text message to the batch as a single
// unmasked frame (the server side of RFC 6455: FIN, opcode 1, the payload
// length in 7, 7+16 or 7+64 bits). The gateway frames its data messages
// itself: coder/websocket writes only control frames on this connection
// (ping, pong, close), each whole in one Write, so frames never interleave,
// and compression is never negotiated. It returns how many bytes the batch
// holds now. Refused once closing.
func (c *corkConn) writeText(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked || c.sealed || c.closeSent {
		return 0, errDataAfterClose
	}
	return c.writeTextLocked(p), nil
}

// writeTextLocked frames p into the collected bytes and returns their
// length. c.mu must be held and c.buf set.
func (c *corkConn) writeTextLocked(p []byte) int {
	b := *c.buf
	switch n := len(p); {
	case n < 126:
		b = append(b, frameText, byte(n))
	case n <= 0xffff:
		b = append(b, frameText, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, frameText, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	*c.buf = append(b, p...)
	return len(*c.buf)
}

// tryWrite sends frames as text messages in one write(2) that never
// blocks, from the goroutine that queued them: a connection that gets an
// event now and then is served without starting a writer goroutine. It
// sends nothing and reports false when the connection is not idle (a batch
// open, another write in progress, closing), has no socket, or its last
// write deadline has passed (the writer sets a new one). The upgrade
// response, if it has not gone out yet, goes first. When the socket takes
// only part of the bytes (its send buffer is full) or refuses them, the
// rest stays collected in an open batch under a write deadline (armLocked,
// as cork sets it) and tryWrite reports true with rest: the writer must
// then flush it before anything else, blocking as usual, and meets the
// error or the slow consumer there.
func (c *corkConn) tryWrite(frames []outFrame, now time.Time, timeout time.Duration) (sent, rest bool) {
	// Never wait for the lock: whoever holds it may be blocked in a write
	// (a pong or close frame coder/websocket writes to a client that does
	// not read), and the caller may be the goroutine that dispatches
	// events to every connection.
	if !c.mu.TryLock() {
		return false, false
	}
	defer c.mu.Unlock()
	if c.raw == nil || c.corked || c.batch || c.sealed || c.closeSent || c.broken ||
		(c.armed && !now.Before(c.until)) {
		return false, false
	}
	c.buf = corkBufs.Get().(*[]byte)
	c.corked = true // writeTextLocked's precondition; undone below
	if c.head != nil {
		// The upgrade response leaves with the first frames (the hello).
		*c.buf = append(*c.buf, c.head...)
		c.head = nil
	}
	for _, f := range frames {
		c.writeTextLocked(f.b)
	}
	c.rawN = 0
	_ = c.raw.Write(c.rawWriteFn) // an error (closed) writes nothing: the writer meets it
	b := *c.buf
	if int(c.rawN) >= len(b) {
		c.release()
		return true, false
	}
	*c.buf = b[:copy(b, b[max(int(c.rawN), 0):])]
	c.midFrame = c.rawN > 0
	c.batch = true
	_ = c.armLocked(now, timeout) // a failure (closed) is the writer's to meet
	return true, true
}

// rawWrite is the callback of raw.Write: one non-blocking write(2) of the
// collected bytes (retried only when interrupted by a signal).
func (c *corkConn) rawWrite(fd uintptr) bool {
	for {
		n, err := syscall.Write(int(fd), *c.buf)
		if err == syscall.EINTR {
			continue
		}
		c.rawN = int32(n) // -1 on EAGAIN or a broken connection: the writer retries and meets it
		return true
	}
}

// flush writes what is collected (under the batch's deadline) and stays
// corked.
func (c *corkConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked()
}

// uncork writes what is collected and ends the batch.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.flushLocked()
	c.release()
	c.batch = false
	return err
}

// seal writes what is collected, bounded by deadline, and turns corking off
// for good, so a close frame written next cannot sit in (and be discarded
// with) a writer's batch.
func (c *corkConn) seal(deadline time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sealed = true
	var err error
	if c.buf != nil && len(*c.buf) > 0 {
		if err = c.Conn.SetWriteDeadline(deadline); err == nil {
			c.armed, c.until = true, deadline
			err = c.flushLocked()
		}
	}
	c.release()
	return err
}

// discard drops what is collected and ends the batch (the connection is
// being torn down).
func (c *corkConn) discard() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.midFrame && c.buf != nil && len(*c.buf) > 0 {
		c.broken = true // the rest of a frame the client has begun to read
	}
	c.release()
	c.batch = false
}

func (c *corkConn) release() {
	c.corked = false
	if c.buf != nil {
		if cap(*c.buf) <= 64<<10 {
			*c.buf = (*c.buf)[:0]
			corkBufs.Put(c.buf)
		}
		c.buf = nil
	}
}

// flushLocked writes what is collected under the deadline already set on
// the socket (by cork or seal).
func (c *corkConn) flushLocked() error {
	if c.buf == nil || len(*c.buf) == 0 {
		return nil
	}
	_, err := c.writeLocked(*c.buf)
	*c.buf = (*c.buf)[:0]
	return err
}

// writeLocked writes b to the socket, unless an earlier write broke the
// stream; a write that fails after part of b went out, or that fails to
// finish a frame begun inline (midFrame), breaks it. c.mu must be held.
func (c *corkConn) writeLocked(b []byte) (int, error) {
	if c.broken {
		return 0, errBroken
	}
	n, err := c.Conn.Write(b)
	if err != nil && (n > 0 || c.midFrame) {
		c.broken = true
	}
	c.midFrame = false // written whole, or broken
	return n, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
