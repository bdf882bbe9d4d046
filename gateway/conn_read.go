package gateway

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// readLoop owns the connection: it waits for each client frame and has it
// read and answered, until the connection ends, then tears everything
// down. Waiting is all it does itself: an idle connection is this
// goroutine blocked in a read of the socket, and that read must stay on
// the runtime's smallest stack (2 KiB). A goroutine's stack grows to the
// deepest call it makes and, blocked in a read, never shrinks back (the
// runtime halves an idle stack only while a quarter of it would hold what
// is in use): coder/websocket's read of a frame header alone grows it to
// 4 KiB. So the reader waits for the first byte of the next frame in the
// read buffer, and a frame worker reads the frame, through coder/websocket
// or, for a ping or pong between messages, itself (frameAside).
func (c *conn) readLoop() {
	h := c.hub
	defer h.wg.Done()
	defer c.teardown()
	for c.waitFrame() && c.frameAside() {
	}
}

// waitFrame waits until a byte of the client's next frame has arrived;
// false when the connection is to end. A close asked for meanwhile
// (wakeReader ends the wait) is performed here.
func (c *conn) waitFrame() bool {
	for {
		if c.closeAsked() {
			c.closeNow(0, "")
			return false
		}
		_, err := c.cork.br.Peek(1)
		if err == nil {
			return true
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !c.closeAsked() {
			return false
		}
	}
}

// frameAside reads and answers the client's next frame on a frame worker
// (frame_workers.go) while the reader waits for it, so frames are still
// handled one at a time and in order; false when the connection is to
// end. Reading a frame, decoding it and a subscribe (its PostgreSQL
// check, Redis SUBSCRIBE, recovery) need a stack several times deeper
// than the reader's wait; the workers' stacks go back to the runtime once
// they have been idle a while.
func (c *conn) frameAside() bool {
	r := frameRuns.Get().(*frameRun)
	r.c = c
	c.hub.frames.run(r)
	ok := <-r.done
	r.c = nil
	frameRuns.Put(r)
	return ok
}

// frameRun hands one frame to frameAside's worker. Pooled with its
// channel, so a frame allocates only the go statement's small closure.
type frameRun struct {
	c    *conn
	done chan bool
}

var frameRuns = sync.Pool{New: func() any { return &frameRun{done: make(chan bool, 1)} }}

func runFrame(r *frameRun) {
	ok := r.c.nextFrame()
	r.c.endFrame()
	r.done <- ok
}

// nextFrame reads the client's next frame and answers it. Its reads are
// bounded on the socket (corkConn.limitRead), in bytes and in time, from
// its first byte to its end: a message may come in any number of
// fragments, empty ones too, which coder/websocket reads inside one Read
// of the message, and only the socket sees them all. The reader waits for
// a frame's first byte without either bound.
func (c *conn) nextFrame() bool {
	h := c.hub
	c.beginRead(frameWireFactor*h.cfg.MaxFrameBytes+maxFrameHeader, time.Now().Add(h.cfg.FrameTimeout))
	if b, err := c.cork.br.Peek(2); err == nil && ownControl(b) {
		return c.control(b[0], int(b[1]&0x7f))
	}
	typ, rd, err := c.ws.Reader((*readContext)(c))
	if err != nil {
		c.endRead()
		c.closeForRead(err)
		return false
	}
	if !c.takeFrame() {
		c.endRead()
		c.closeNow(ClosePolicy, "frame rate")
		return false
	}
	if typ != websocket.MessageText {
		c.endRead()
		c.closeNow(CloseUnsupported, "text frames only")
		return false
	}
	return c.frame(rd)
}

// maxFrameHeader is the longest WebSocket frame header a client sends
// (2 bytes, a 64-bit length, the mask key).
const maxFrameHeader = 14

// boundCloseRead bounds the reads of the close handshake on cc: the rest of
// a frame being read and the client's close frame, with a few control
// frames between, within CloseTimeout. coder/websocket's wait for the
// client's close bounds only each frame header in time, and discards a
// data frame's payload a byte at a time without any bound: a client that
// declared a frame of 2^62 bytes and then sent nothing, or kept sending,
// held the socket and its goroutine for good. Past either bound the read
// fails and the library closes the socket.
func (h *Hub) boundCloseRead(cc *corkConn) {
	cc.limitRead(frameWireFactor*h.cfg.MaxFrameBytes+4*(maxFrameHeader+125), time.Now().Add(h.cfg.CloseTimeout))
}

// closeForRead ends the connection after a failed read: a read over the
// frame's bounds closes with 1008, a close asked for meanwhile (the
// reader's wake-up ends a read too) is performed; anything else (the
// client's close, a protocol error coder/websocket answered, a dead
// socket) leaves the connection to end as it is.
func (c *conn) closeForRead(err error) {
	switch {
	case c.closeAsked():
		c.closeNow(0, "")
	case errors.Is(err, errFrameWire):
		c.closeNow(ClosePolicy, "frame too big")
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.closeNow(ClosePolicy, "frame too slow")
	}
}

// ownControl reports whether a frame starting with b (its first two
// bytes) is a ping or pong the gateway reads itself: unfragmented, no
// extension bits, masked (as every client frame must be) and at most 125
// bytes of payload. Anything else is coder/websocket's to read, and to
// refuse when it breaks the protocol.
func ownControl(b []byte) bool {
	return (b[0] == opPing || b[0] == opPong) && b[1]&0x80 != 0 && b[1]&0x7f <= 125
}

// control reads a ping or pong frame (ownControl) and answers it: a ping
// with a pong carrying its payload, a pong by ending the wait for one
// (pong). Each takes a token of the frame bucket like any frame.
func (c *conn) control(op byte, size int) bool {
	h := c.hub
	buf := getFrameBuf(2 + 4 + size)
	defer putFrameBuf(buf)
	b := *buf
	_, err := io.ReadFull(c.cork.br, b)
	c.endRead()
	if err != nil {
		c.closeForRead(err)
		return false
	}
	if !c.takeFrame() {
		c.closeNow(ClosePolicy, "frame rate")
		return false
	}
	if op == opPong {
		c.pong()
		return true
	}
	payload := b[6:]
	key := b[2:6]
	for i := range payload {
		payload[i] ^= key[i&3]
	}
	// A pong the socket does not take in time ends the connection, as a
	// batch would.
	return c.cork.writeControl(opPong, payload, time.Now(), h.cfg.WriteTimeout) == nil
}

// pong ends the wait for a pong: any pong answers the last ping (a client
// may also send them unasked, as a heartbeat).
func (c *conn) pong() {
	c.mu.Lock()
	c.pongWait = false
	c.mu.Unlock()
}

// frame reads one text message's payload from rd, under the bounds
// nextFrame set, and answers it.
func (c *conn) frame(rd io.Reader) bool {
	h := c.hub
	buf := getFrameBuf(h.cfg.MaxFrameBytes + 1)
	n, err := io.ReadFull(rd, *buf)
	c.endRead()
	switch {
	case err == nil:
		putFrameBuf(buf)
		c.closeNow(ClosePolicy, "frame too big")
		return false
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
	default:
		putFrameBuf(buf)
		c.closeForRead(err)
		return false
	}
	f, ok := parseInFrame((*buf)[:n])
	putFrameBuf(buf)
	h.stats.framesIn.Add(1)
	if !ok {
		c.send(encodeError(errInvalidFrame))
		return true
	}
	return c.handle(f)
}

// frameWireFactor: a frame may take this many times MaxFrameBytes on the
// wire while it is read (its payload, its fragments' headers, control
// frames between them).
const frameWireFactor = 2

// takeFrame takes a token from the connection's inbound frame bucket
// (Config.FrameRate a second, at most Config.FrameBurst): every frame
// the client sends costs one, WebSocket pings and pongs included. False
// when none is left, and for every frame after that. The bucket is kept
// as the time it is full again (frameFull), one word per connection: it
// holds FrameBurst tokens less one per FrameRate interval that time is
// ahead of now.
func (c *conn) takeFrame() bool {
	cfg := &c.hub.cfg
	per := time.Duration(float64(time.Second) / cfg.FrameRate)
	if _, ok := takeToken(&c.frameFull, sinceStart(), per, cfg.FrameBurst); !ok {
		c.frameFull = math.MaxInt64
		return false
	}
	return true
}

// takeToken spends a token of a bucket kept as the time it is full again
// (*full, on sinceStart's clock): it holds burst tokens and gains one every
// per. When none is left it returns false and how long until one is.
func takeToken(full *time.Duration, now, per time.Duration, burst int) (wait time.Duration, ok bool) {
	if ahead := *full - now - time.Duration(burst-1)*per; ahead > 0 {
		return ahead, false
	}
	*full = max(*full, now) + per
	return 0, true
}

// clockStart is the origin of sinceStart.
var clockStart = time.Now()

// sinceStart reads the monotonic clock in one word: a wall clock step
// does not move it.
func sinceStart() time.Duration { return time.Since(clockStart) }

// readContext is the context of the connection's reads (conn.readLoop):
// like context.Background it is never done and has no deadline (see
// opContext), and it carries the connection to pingReceived and
// pongReceived, which coder/websocket calls with a context derived from
// it. It is the conn itself, so the callbacks cost no allocation per
// connection (a closure per connection would).
type readContext conn

type readContextKey struct{}

func (*readContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*readContext) Done() <-chan struct{}       { return nil }
func (*readContext) Err() error                  { return nil }

func (rc *readContext) Value(key any) any {
	if key == (readContextKey{}) {
		return (*conn)(rc)
	}
	return nil
}

// pingReceived is the connection's AcceptOptions.OnPingReceived, for the
// pings coder/websocket reads itself (between the fragments of a message;
// the gateway reads those between messages: conn.control): a WebSocket
// ping takes a token like any frame; the library answers it with a pong
// only when it got one. Reads without the connection in their context
// are the library's close handshake: the close frame has gone out and no
// frame may follow it (the library would fail the handshake writing the
// pong, and close the socket on a client still sending: its unread bytes
// would reset the connection, close frame and all).
func pingReceived(ctx context.Context, _ []byte) bool {
	c, ok := ctx.Value(readContextKey{}).(*conn)
	return ok && c.controlFrame()
}

// pongReceived is OnPongReceived: a pong takes a token too, whether it
// answers the server's ping or comes unasked.
func pongReceived(ctx context.Context, _ []byte) {
	if c, ok := ctx.Value(readContextKey{}).(*conn); ok && c.controlFrame() {
		c.pong()
	}
}

// controlFrame charges a ping or pong of the client to the frame bucket;
// false when it is over the rate. It runs inside coder/websocket's read,
// which holds the library's read lock, and a close handshake waits for
// that lock: so the close is asked for (closeWith), which ends the read,
// and performed after it (closeForRead), with 1008 like a data frame over
// the rate.
func (c *conn) controlFrame() bool {
	if c.takeFrame() {
		return true
	}
	c.closeWith(ClosePolicy, "frame rate")
	return false
}

// handle answers one client frame; false when it closed the connection.
func (c *conn) handle(f inFrame) bool {
	switch f.Type {
	case "ping":
		c.send(pongFrame)
	case "subscribe":
		c.subscribe(f.DialogID, f.Since.value())
	case "unsubscribe":
		if id, ok := ids.Canonical(f.DialogID); ok {
			c.hub.detach(c, id)
		} else {
			c.send(encodeError(errInvalidUUID))
		}
	case "typing":
		c.typing(f.DialogID)
	case "refresh":
		return c.refresh(f.Token)
	default:
		c.send(encodeError(errUnknownType))
	}
	return true
}

// refresh moves the connection's expiry to a new token's exp (plus the
// leeway) and answers refreshed. It runs on the reader, bounded by
// AuthTimeout.
//
// The token is looked at only while the client's budget of refused
// credentials (CredentialGate, the one its handshake and the REST API
// spend) holds a unit: otherwise the frame is answered with the error
// rate_limited and a retryMs, without a signature check, and the
// connection keeps its credential. A token that fails verification is
// answered with an error frame, spends one unit and changes nothing; a
// valid token that is not a session of this connection's user closes it
// with 4003.
func (c *conn) refresh(token string) bool {
	h := c.hub
	if c.credSubject != nil {
		if wait, ok := h.creds.Allow(*c.credSubject); !ok {
			h.countRefreshReject("auth_limited")
			c.send(encodeRetryError(errRateLimited, h.retryMsAfter(wait)))
			return true
		}
	}
	ctx, cancel := opContext(h.cfg.AuthTimeout)
	p, err := h.deps.Verifier.Verify(ctx, token)
	cancel()
	// A valid token of another user, or a service token, spends nothing:
	// it passed verification, so it is a credential someone was issued,
	// not a forgery the budget is there to bound, and the REST API does
	// not count it either. It ends the connection, so sending another one
	// takes a new handshake, which that budget and the user's handshake
	// rate bound.
	switch {
	case err != nil:
		if c.credSubject != nil {
			h.creds.Refused(*c.credSubject)
		}
		h.countRefreshReject("unauthorized")
		c.send(encodeError(errUnauthorized))
		return true
	case p.Kind != auth.KindUser:
		h.countRefreshReject("forbidden")
		c.closeNow(CloseForbidden, CloseReasonUserSession)
		return false
	case p.UserID != c.userID:
		h.countRefreshReject("user_mismatch")
		c.closeNow(CloseForbidden, CloseReasonUserMismatch)
		return false
	}
	c.mu.Lock()
	c.expires = expiresNs(p.Expires.Add(h.deps.Verifier.Leeway()))
	c.mu.Unlock()
	c.send(mustJSON(refreshedFrame{Type: "refreshed", ExpiresAt: p.Expires.UnixMilli(),
		ServerTime: time.Now().UnixMilli()}))
	return true
}

// subscribe answers a subscribe frame. With sinceSeq (since ≥ 0) the
// dialog's missed message.created events are replayed before subscribed,
// or a resync for the dialog is sent when they cannot be.
func (c *conn) subscribe(raw string, since int64) {
	h := c.hub
	dialogID, ok := ids.Canonical(raw)
	if !ok {
		c.send(encodeError(errInvalidUUID))
		return
	}
	ctx, cancel := opContext(h.cfg.SubscribeTimeout)
	defer cancel()
	c.mu.Lock()
	existing, _ := c.subLocked(dialogID)
	n := len(c.subs)
	c.mu.Unlock()
	if existing != nil {
		// Already subscribed: answer again with a fresh lastSeq. The live
		// subscription has delivered everything since it began; a replay now
		// would interleave with it, so a sinceSeq is answered with a resync.
		seq, err := h.deps.Store.DialogLastSeq(ctx, dialogID, c.userID)
		if err != nil {
			if errors.Is(err, store.ErrDialogNotFound) {
				// No longer a member: the subscription ends here, and
				// nothing of the dialog follows the error.
				h.detach(c, dialogID)
			}
			c.send(encodeError(subscribeErrCode(err)))
			return
		}
		if since >= 0 {
			c.send(encodeDialogResync(ResyncRecoveryUnavailable, dialogID))
		}
		c.send(subscribedJSON(dialogID, seq, since >= 0, false))
		return
	}
	if n >= h.cfg.MaxSubscriptions {
		c.send(encodeError(errTooManySubscriptions))
		return
	}
	channel := pubsub.DialogChannel(dialogID)
	if since < 0 && h.deps.Subscriber.Join(channel) {
		// The instance already listens on the channel, so subscribing
		// costs Redis nothing: attach first, then one read checks
		// membership and gives lastSeq (a non-member is detached before
		// anything buffered for it is sent).
		c.joinSubscribed(ctx, dialogID, channel)
		return
	}
	// Membership before the Redis SUBSCRIBE, with the same batched check
	// that reads lastSeq below (concurrent subscribes share one query).
	if _, err := h.deps.Store.DialogLastSeq(ctx, dialogID, c.userID); err != nil {
		c.send(encodeError(subscribeErrCode(err)))
		return
	}
	if err := h.deps.Subscriber.Subscribe(ctx, channel); err != nil {
		c.send(encodeError(errUnavailable))
		return
	}
	s := h.attach(c, channel)
	if s == nil {
		h.deps.Subscriber.Unsubscribe(channel)
		return
	}
	if since >= 0 {
		c.recoverSub(s, since)
		return
	}
	// Read after the SUBSCRIBE is confirmed: everything published before
	// the confirmation has a seq ≤ lastSeq (publishes follow commits).
	c.readyAfterCheck(ctx, s, dialogID, sinceAnswer{})
}

// recoverSub finishes a subscribe with sinceSeq whose channel is attached:
// the missed events, subscribed, then the live events that arrived
// meanwhile and are not among the replayed ones. When the user has no
// recovery read left (recoverer) it is answered as a subscribe whose
// replay is not possible: the dialog's resync, then subscribed with the
// lastSeq of a read made after the attach, then the live events.
func (c *conn) recoverSub(s *sub, since int64) {
	h := c.hub
	rec, err := h.rec.recover(c.userID, s.dialogID(), s.channel, since)
	if errors.Is(err, errRecoveryBudget) {
		ctx, cancel := opContext(h.cfg.SubscribeTimeout) // the subscribe's may be spent waiting on a joined read
		defer cancel()
		if c.readyAfterCheck(ctx, s, s.dialogID(), sinceAnswer{set: true}) {
			h.rec.count(false)
			h.rec.refused.Add(1)
		}
		return
	}
	if err != nil {
		h.detach(c, s.dialogID())
		c.send(encodeError(subscribeErrCode(err)))
		return
	}
	var head []outFrame
	if rec.ok {
		head = make([]outFrame, len(rec.frames))
		for i, b := range rec.frames {
			head[i] = outFrame{b, classDurable}
		}
	}
	h.rec.count(c.ready(s, head, rec.lastSeq, sinceAnswer{set: true, recovered: rec.ok}, rec.upTo))
}

// sinceAnswer is what subscribed says about a subscribe's sinceSeq: set
// when it carried one, recovered when the missed events precede it.
type sinceAnswer struct{ set, recovered bool }

// ready queues head (a recovery's replay), the subscribed frame and the
// subscription's pending events, leaving out message.created events with
// seq ≤ upTo (replayed in head already), and lets later events through
// directly. A recovery that was not possible, or whose replay the queue
// could not take (it overflowed, or a resync waiting in it covers every
// event queued after it), is announced by the dialog's resync and
// recovered false. It reports whether the subscribe was answered as
// recovered.
func (c *conn) ready(s *sub, head []outFrame, lastSeq int64, since sinceAnswer, upTo int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return since.recovered
	}
	// The pending events move into the queue, whose bounds they now
	// count against.
	pending := s.pending
	c.pendingBytes -= s.pendingBytes
	s.pending, s.pendingBytes = nil, 0
	// Queued together, written together (one write when they fit).
	for _, f := range head {
		if !c.enqueueLocked(f) {
			since.recovered = false
		}
	}
	if since.set && !since.recovered {
		c.enqueueLocked(outFrame{encodeDialogResync(ResyncRecoveryUnavailable, s.dialogID()), classControl})
		upTo = 0
	}
	c.enqueueLocked(outFrame{subscribedJSON(s.dialogID(), lastSeq, since.set, since.recovered), classControl})
	for _, f := range pending {
		if upTo > 0 {
			if seq := createdSeq(f.b); seq > 0 && seq <= upTo {
				continue
			}
		}
		c.enqueueLocked(f)
	}
	switch {
	case c.resyncQueued:
		// The resync waiting in the queue is ahead of this subscribed
		// frame, so it does not cover the dialog, yet the dialog's events
		// are dropped as covered until it is written: it moves behind.
		c.resyncLastLocked()
	case s.pendingOverflow:
		c.queueResyncLocked(ResyncSlowConsumer)
	case s.pendingLost:
		c.queueResyncLocked(ResyncReconnect)
	}
	c.signalInline()
	s.pendingOverflow, s.pendingLost, s.ready, s.replayedUpTo = false, false, true, upTo
	return since.recovered
}

// joinSubscribed finishes a subscribe whose channel reference Join took:
// attached, then membership and lastSeq in one read after the attach, so
// everything published after the read reaches the connection live.
func (c *conn) joinSubscribed(ctx context.Context, dialogID, channel string) {
	h := c.hub
	s := h.attach(c, channel)
	if s == nil {
		h.deps.Subscriber.Unsubscribe(channel)
		return
	}
	c.readyAfterCheck(ctx, s, dialogID, sinceAnswer{})
}

// readyAfterCheck reads the dialog's lastSeq (checking membership with the
// same read) for an attached subscription and makes it ready with no
// replay, or detaches it with the error; false when it did.
func (c *conn) readyAfterCheck(ctx context.Context, s *sub, dialogID string, since sinceAnswer) bool {
	seq, err := c.hub.deps.Store.DialogLastSeq(ctx, dialogID, c.userID)
	if err != nil {
		c.hub.detach(c, dialogID)
		c.send(encodeError(subscribeErrCode(err)))
		return false
	}
	c.ready(s, nil, seq, since, 0)
	return true
}

// subscribedJSON is the subscribed frame; recovered is set only when the
// subscribe carried sinceSeq.
func subscribedJSON(dialogID string, lastSeq int64, withSince, recovered bool) []byte {
	f := subscribedFrame{Type: "subscribed", DialogID: dialogID, LastSeq: lastSeq}
	if withSince {
		f.Recovered = &recovered
	}
	return mustJSON(f)
}

func subscribeErrCode(err error) string {
	if errors.Is(err, store.ErrDialogNotFound) {
		return errDialogNotFound
	}
	return errUnavailable
}

// typing publishes an ephemeral typing event to a subscribed dialog, at
// most once per TypingInterval per dialog; extra frames are dropped.
func (c *conn) typing(raw string) {
	h := c.hub
	dialogID, ok := ids.Canonical(raw)
	if !ok {
		c.send(encodeError(errInvalidUUID))
		return
	}
	now := time.Now().UnixNano()
	c.mu.Lock()
	s, _ := c.subLocked(dialogID)
	allowed := s != nil && s.ready && (s.lastTyping == 0 || time.Duration(now-s.lastTyping) >= h.cfg.TypingInterval)
	if allowed {
		s.lastTyping = now
	}
	c.mu.Unlock()
	if s == nil || !s.ready {
		c.send(encodeError(errNotSubscribed))
		return
	}
	if !allowed {
		h.stats.typingDrops.Add(1)
		return
	}
	data := mustJSON(typingData{UserID: c.userID})
	payload, err := pubsub.NewDialogEvent(ids.New(), EventTyping, c.userID, dialogID, 0, data).Encode()
	if err != nil {
		return
	}
	ctx, cancel := opContext(time.Second)
	defer cancel()
	_ = h.deps.Publisher.Publish(ctx, pubsub.DialogChannel(dialogID), payload)
}
