package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

type outFrame struct {
	b     []byte
	class frameClass
}

// sub is one dialog subscription of a connection. Until ready (the
// subscribed frame is queued) its events wait in pending, so no event of a
// dialog reaches the client before its subscribed frame.
type sub struct {
	dialogID        string
	channel         string
	ready           bool
	pending         []outFrame
	pendingOverflow bool
	lastTyping      time.Time
}

// conn is one WebSocket connection. Its reader goroutine owns reads and the
// connection's lifetime. A writer goroutine runs only while there is
// something to write: queueing work starts one when none runs, and it exits
// once the queue is empty, so an idle connection costs one goroutine (the
// reader) — docs/benchmarks.md. When the reader returns it marks the
// connection closed (no writer starts after that), closes the socket and
// waits for the running writer.
type conn struct {
	hub    *Hub
	ws     *websocket.Conn
	id     string
	userID string
	cork   *corkConn // the hijacked connection; nil when not hijacked by us
	ctx    context.Context
	cancel context.CancelFunc

	writer sync.WaitGroup // the running writer, if any

	mu           sync.Mutex // guards everything below
	writing      bool       // a writer goroutine runs
	spare        []outFrame // a small batch slice kept for the next writer
	q            []outFrame
	qBytes       int
	resyncQueued bool // a resync is queued and not yet taken by the writer
	pingDue      bool
	lastPing     time.Time
	// expires (Unix ns) is when the credential stops being valid: its exp
	// plus the verifier's leeway. The ping loop closes the connection with
	// 4001 token_expired then; a refresh frame moves it.
	expires      int64
	closeCode    websocket.StatusCode
	closeReason  string
	closed       bool
	subs         map[string]*sub // dialog id → subscription
	overflows    int
	overflowFrom time.Time
}

func newConn(h *Hub, ws *websocket.Conn, cork *corkConn, userID string, expires time.Time) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{hub: h, ws: ws, cork: cork, id: ids.New(), userID: userID, ctx: ctx, cancel: cancel,
		subs: map[string]*sub{}, lastPing: time.Now(), expires: expires.UnixNano()}
}

// signal makes sure a writer runs to pick up what was just queued. c.mu must
// be held.
func (c *conn) signal() {
	if c.writing || c.closed {
		return
	}
	c.writing = true
	c.writer.Add(1)
	go c.writeLoop()
}

// deliver queues a fanned-out frame for s (nil: the user's own channel).
// It never blocks.
func (c *conn) deliver(s *sub, b []byte, class frameClass) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if s != nil && !s.ready {
		switch {
		case class == classEphemeral:
			c.hub.stats.ephemeralDrops.Add(1)
		case len(s.pending) >= c.hub.cfg.QueueFrames:
			s.pending, s.pendingOverflow = nil, true
		case !s.pendingOverflow:
			s.pending = append(s.pending, outFrame{b, class})
		}
		return
	}
	c.enqueueLocked(outFrame{b, class})
}

// send queues a control frame.
func (c *conn) send(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.enqueueLocked(outFrame{b, classControl})
	}
}

// enqueueLocked applies the backpressure policy: ephemeral frames are
// dropped once the queue is half full; a durable event that does not fit
// replaces every queued event with one resync; durable events arriving
// while that resync waits are covered by it and dropped.
func (c *conn) enqueueLocked(f outFrame) {
	cfg := &c.hub.cfg
	switch f.class {
	case classEphemeral:
		if 2*len(c.q) >= cfg.QueueFrames || 2*(c.qBytes+len(f.b)) > cfg.QueueBytes {
			c.hub.stats.ephemeralDrops.Add(1)
			return
		}
	case classDurable:
		if c.resyncQueued {
			c.hub.stats.coveredDrops.Add(1)
			return
		}
		if len(c.q) >= cfg.QueueFrames || c.qBytes+len(f.b) > cfg.QueueBytes {
			c.overflowLocked()
			return
		}
	case classControl:
		// Control frames answer the client's own requests, which the
		// inbound frame rate bounds; a client that sends requests but never
		// reads the answers fills this margin and is closed.
		if len(c.q) >= cfg.QueueFrames+cfg.FrameBurst {
			c.closeLocked(CloseSlowConsumer, "slow consumer")
			return
		}
	}
	c.q = append(c.q, f)
	c.qBytes += len(f.b)
	c.hub.stats.observeQueue(len(c.q))
	c.signal()
}

func (c *conn) overflowLocked() {
	h := c.hub
	h.stats.overflows.Add(1)
	kept := c.q[:0]
	bytes := 0
	for _, f := range c.q {
		if f.class == classControl {
			kept = append(kept, f)
			bytes += len(f.b)
		}
	}
	clear(c.q[len(kept):])
	c.q, c.qBytes = kept, bytes
	now := time.Now()
	if now.Sub(c.overflowFrom) > h.cfg.OverflowWindow {
		c.overflowFrom, c.overflows = now, 0
	}
	c.overflows++
	if c.overflows > h.cfg.MaxOverflows {
		c.closeLocked(CloseSlowConsumer, "slow consumer")
		return
	}
	c.queueResyncLocked(ResyncSlowConsumer)
}

func (c *conn) queueResyncLocked(reason string) {
	if c.resyncQueued || c.closed {
		return
	}
	c.hub.stats.resyncs.Add(1)
	c.q = append(c.q, outFrame{encodeResync(reason), classControl})
	c.qBytes += len(c.q[len(c.q)-1].b)
	c.resyncQueued = true
	c.signal()
}

func (c *conn) resync(reason string) {
	c.mu.Lock()
	c.queueResyncLocked(reason)
	c.mu.Unlock()
}

// closeLocked asks the writer to close the connection with code; the first
// request wins.
func (c *conn) closeLocked(code websocket.StatusCode, reason string) {
	if c.closeCode != 0 || c.closed {
		return
	}
	if code == CloseSlowConsumer {
		c.hub.stats.slowCloses.Add(1)
	}
	c.closeCode, c.closeReason = code, reason
	c.q, c.qBytes = nil, 0
	c.signal()
}

func (c *conn) closeWith(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	c.closeLocked(code, reason)
	c.mu.Unlock()
}

// closeNow closes from the reader goroutine (a protocol violation): the
// reader performs the close handshake itself, since it is the one reading.
func (c *conn) closeNow(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	first := c.closeCode == 0 && !c.closed
	if first {
		c.closeCode, c.closeReason = code, reason
		c.q, c.qBytes = nil, 0
	}
	c.mu.Unlock()
	if first {
		c.hub.countClose(code)
		if c.cork != nil {
			// A writer mid-batch would otherwise buffer the close frame
			// and drop it when its next write fails: the client would
			// see EOF instead of the close code.
			_ = c.cork.seal(time.Now().Add(c.hub.cfg.WriteTimeout))
		}
		_ = c.ws.Close(code, reason)
	}
}

// writeLoop drains the queue: it takes everything queued, writes it as one
// batch (one syscall through the cork), and exits when the queue is empty
// (signal starts the next writer). It also sends the WebSocket pings the
// hub asks for and performs the closes the hub decides on (drain, slow
// consumer). A writer that stops on an error leaves writing set, so no
// other writer starts on the failed connection.
func (c *conn) writeLoop() {
	defer c.writer.Done()
	for {
		c.mu.Lock()
		if c.ctx.Err() != nil {
			c.mu.Unlock()
			return
		}
		if len(c.q) == 0 && !c.pingDue && c.closeCode == 0 {
			c.writing = false
			c.mu.Unlock()
			return
		}
		batch := c.q
		c.q, c.qBytes, c.resyncQueued = c.spare, 0, false
		c.spare = nil
		ping := c.pingDue
		c.pingDue = false
		code, reason := c.closeCode, c.closeReason
		c.mu.Unlock()
		if err := c.writeBatch(batch); err != nil {
			c.abort(err)
			return
		}
		clear(batch)
		// Keep a small buffer for the next batch; let a large one go so
		// an idle connection holds little memory.
		if cap(batch) <= 16 {
			c.mu.Lock()
			if c.spare == nil && !c.closed {
				c.spare = batch[:0]
			}
			c.mu.Unlock()
		}
		if code != 0 {
			c.hub.countClose(code)
			_ = c.ws.Close(code, reason)
			c.cancel()
			return
		}
		if ping {
			pctx, cancel := opContext(c.hub.cfg.PongTimeout)
			err := c.ws.Ping(pctx)
			cancel()
			if err != nil {
				c.abort(err)
				return
			}
		}
	}
}

func (c *conn) writeBatch(batch []outFrame) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := opContext(c.hub.cfg.WriteTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	if c.cork != nil {
		c.cork.cork()
	}
	for _, f := range batch {
		err := c.ws.Write(ctx, websocket.MessageText, f.b)
		if err == nil && c.cork != nil && c.cork.buffered() >= corkFlushBytes {
			err = c.cork.flush(deadline)
		}
		if err != nil {
			if c.cork != nil {
				c.cork.discard()
			}
			if c.ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) {
				c.hub.stats.slowCloses.Add(1)
			}
			return err
		}
	}
	if c.cork != nil {
		if err := c.cork.uncork(deadline); err != nil {
			if c.ctx.Err() == nil && isTimeout(err) {
				c.hub.stats.slowCloses.Add(1)
			}
			return err
		}
	}
	return nil
}

// abort ends a connection whose writer failed (write timeout, dead peer).
func (c *conn) abort(err error) {
	if c.ctx.Err() == nil {
		c.hub.logger.Debug("websocket writer stopped", slog.String("connection", c.id), slog.String("kind", store.Kind(err)))
	}
	_ = c.ws.CloseNow()
	c.cancel()
}

// readLoop owns the connection: it reads and handles client frames until
// the connection ends, then tears everything down.
func (c *conn) readLoop() {
	h := c.hub
	defer h.wg.Done()
	defer c.teardown()

	tokens, last := float64(h.cfg.FrameBurst), time.Now()
	for {
		// No cancellable context: closing the socket ends the read (see
		// opContext).
		typ, rd, err := c.ws.Reader(context.Background())
		if err != nil {
			return
		}
		now := time.Now()
		tokens = min(float64(h.cfg.FrameBurst), tokens+now.Sub(last).Seconds()*h.cfg.FrameRate)
		last = now
		if tokens < 1 {
			c.closeNow(ClosePolicy, "frame rate")
			return
		}
		tokens--
		if typ != websocket.MessageText {
			c.closeNow(CloseUnsupported, "text frames only")
			return
		}
		buf := getFrameBuf(h.cfg.MaxFrameBytes + 1)
		n, err := io.ReadFull(rd, *buf)
		switch {
		case err == nil:
			putFrameBuf(buf)
			c.closeNow(ClosePolicy, "frame too big")
			return
		case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		default:
			putFrameBuf(buf)
			return
		}
		f, ok := parseInFrame((*buf)[:n])
		putFrameBuf(buf)
		h.stats.framesIn.Add(1)
		if !ok {
			c.send(encodeError(errInvalidFrame))
			continue
		}
		if !c.handle(f) {
			return
		}
	}
}

// handle answers one client frame; false when it closed the connection.
func (c *conn) handle(f inFrame) bool {
	switch f.Type {
	case "ping":
		c.send(pongFrame)
	case "subscribe":
		c.subscribe(f.DialogID)
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
// leeway) and answers refreshed. A token that fails verification is
// answered with an error frame and changes nothing; a valid token that is
// not a session of this connection's user closes it with 4003. It runs on
// the reader, bounded by AuthTimeout.
func (c *conn) refresh(token string) bool {
	h := c.hub
	ctx, cancel := opContext(h.cfg.AuthTimeout)
	p, err := h.deps.Verifier.Verify(ctx, token)
	cancel()
	switch {
	case err != nil:
		c.send(encodeError(errUnauthorized))
		return true
	case p.Kind != auth.KindUser:
		c.closeNow(CloseForbidden, CloseReasonUserSession)
		return false
	case p.UserID != c.userID:
		c.closeNow(CloseForbidden, CloseReasonUserMismatch)
		return false
	}
	c.mu.Lock()
	c.expires = p.Expires.Add(h.deps.Verifier.Leeway()).UnixNano()
	c.mu.Unlock()
	c.send(mustJSON(refreshedFrame{Type: "refreshed", ExpiresAt: p.Expires.UnixMilli()}))
	return true
}

func (c *conn) subscribe(raw string) {
	h := c.hub
	dialogID, ok := ids.Canonical(raw)
	if !ok {
		c.send(encodeError(errInvalidUUID))
		return
	}
	ctx, cancel := opContext(h.cfg.SubscribeTimeout)
	defer cancel()
	c.mu.Lock()
	existing, n := c.subs[dialogID], len(c.subs)
	c.mu.Unlock()
	if existing != nil {
		// Already subscribed: answer again with a fresh lastSeq.
		seq, err := h.deps.Store.DialogLastSeq(ctx, dialogID, c.userID)
		if err != nil {
			c.send(encodeError(subscribeErrCode(err)))
			return
		}
		c.send(mustJSON(subscribedFrame{Type: "subscribed", DialogID: dialogID, LastSeq: seq}))
		return
	}
	if n >= h.cfg.MaxSubscriptions {
		c.send(encodeError(errTooManySubscriptions))
		return
	}
	member, err := h.deps.Store.IsMember(ctx, dialogID, c.userID)
	if err != nil || !member {
		c.send(encodeError(subscribeErrCode(errOr(err, store.ErrDialogNotFound))))
		return
	}
	channel := pubsub.DialogChannel(dialogID)
	if err := h.deps.Subscriber.Subscribe(ctx, channel); err != nil {
		c.send(encodeError(errUnavailable))
		return
	}
	s := &sub{dialogID: dialogID, channel: channel}
	if !h.attach(c, s) {
		h.deps.Subscriber.Unsubscribe(channel)
		return
	}
	// Read after the SUBSCRIBE is confirmed: everything published before
	// the confirmation has a seq ≤ lastSeq (publishes follow commits).
	seq, err := h.deps.Store.DialogLastSeq(ctx, dialogID, c.userID)
	if err != nil {
		h.detach(c, dialogID)
		c.send(encodeError(subscribeErrCode(err)))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.enqueueLocked(outFrame{mustJSON(subscribedFrame{Type: "subscribed", DialogID: dialogID, LastSeq: seq}), classControl})
	for _, f := range s.pending {
		c.enqueueLocked(f)
	}
	if s.pendingOverflow {
		c.queueResyncLocked(ResyncSlowConsumer)
	}
	s.pending, s.pendingOverflow, s.ready = nil, false, true
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
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
	now := time.Now()
	c.mu.Lock()
	s := c.subs[dialogID]
	allowed := s != nil && s.ready && now.Sub(s.lastTyping) >= h.cfg.TypingInterval
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

// teardown runs once the reader returned: stop the writer, leave every
// channel, and record the disconnect in presence and PostgreSQL.
func (c *conn) teardown() {
	h := c.hub
	// closed first, under mu: no writer starts after this, so the Wait
	// below cannot race a writer.Add.
	c.mu.Lock()
	c.closed = true
	c.q, c.spare = nil, nil
	c.mu.Unlock()
	c.cancel()
	_ = c.ws.CloseNow() // ends a write the writer may be blocked in
	c.writer.Wait()
	channels := h.remove(c)
	for _, ch := range channels {
		h.deps.Subscriber.Unsubscribe(ch)
	}
	if h.killed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	at, err := h.deps.Presence.Disconnect(ctx, c.userID, c.id)
	if err != nil {
		h.logger.Warn("presence disconnect failed; the connection expires with its TTL",
			slog.String("connection", c.id), slog.String("kind", store.Kind(err)))
	}
	if err := h.deps.Store.TouchLastSeen(ctx, c.userID, at); err != nil {
		h.logger.Warn("last seen not recorded", slog.String("kind", store.Kind(err)))
	}
}

// opContext bounds one operation of a connection. It deliberately does not
// derive from conn.ctx: every context derived from a cancellable parent
// allocates the parent's done channel and children map, and coder/websocket
// registers a context.AfterFunc for the blocking read of every idle
// connection — together ≈ 1.4 KiB per idle connection (docs/benchmarks.md).
// Instead, whoever cancels conn.ctx also closes the socket (abort, teardown,
// Hub.closeAll, the writer after a close handshake), which ends any read,
// write or ping in progress. conn.ctx only answers Err().
func opContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

var frameBufs sync.Pool

func getFrameBuf(n int) *[]byte {
	if b, ok := frameBufs.Get().(*[]byte); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n)
	return &b
}

func putFrameBuf(b *[]byte) { frameBufs.Put(b) }
