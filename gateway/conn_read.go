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

// readLoop owns the connection: it reads and handles client frames until
// the connection ends, then tears everything down.
func (c *conn) readLoop() {
	h := c.hub
	defer h.wg.Done()
	defer c.teardown()

	for {
		// No cancellable context: closing the socket ends the read (see
		// opContext). readContext carries the connection to the ping and
		// pong callbacks.
		typ, rd, err := c.ws.Reader((*readContext)(c))
		if err != nil {
			return
		}
		if !c.takeFrame() {
			c.closeNow(ClosePolicy, "frame rate")
			return
		}
		if typ != websocket.MessageText {
			c.closeNow(CloseUnsupported, "text frames only")
			return
		}
		if !c.frameAside(rd) {
			return
		}
	}
}

// frameAside reads, decodes and answers one client text frame on a
// short-lived goroutine while the reader waits for it, so frames are still
// handled one at a time and in order; false when the connection is to end.
// Reading the payload, decoding it and a subscribe (its PostgreSQL check,
// Redis SUBSCRIBE, recovery) need a stack several times deeper than the
// blocking read the reader spends its life in. Grown on the reader, that
// stack would stay for the connection's life: the runtime halves an idle
// goroutine's stack only while a quarter of it would still hold what is in
// use, and the blocking read uses more than a quarter of 8 KiB
// (docs/benchmarks.md, "Idle connections"). The helper is one of the hub's
// frame workers (frame_workers.go), whose stacks go back to the runtime
// once they have been idle a while.
func (c *conn) frameAside(rd io.Reader) bool {
	r := frameRuns.Get().(*frameRun)
	r.c, r.rd = c, rd
	c.hub.frames.run(r)
	ok := <-r.done
	r.c, r.rd = nil, nil
	frameRuns.Put(r)
	return ok
}

// frameRun hands one frame to frameAside's helper. Pooled with its
// channel, so a frame allocates only the go statement's small closure.
type frameRun struct {
	c    *conn
	rd   io.Reader
	done chan bool
}

var frameRuns = sync.Pool{New: func() any { return &frameRun{done: make(chan bool, 1)} }}

func runFrame(r *frameRun) { r.done <- r.c.frame(r.rd) }

// frame reads one text frame's payload from rd and answers it. The frame
// may come in fragments, which coder/websocket reads inside rd's Read
// (empty ones without returning): so the reads of a frame are bounded on
// the socket (corkConn.limitRead), in bytes, including the fragments'
// headers, and in time. The reader waits for the next frame without
// either.
func (c *conn) frame(rd io.Reader) bool {
	h := c.hub
	if c.cork != nil {
		c.cork.limitRead(frameWireFactor*h.cfg.MaxFrameBytes, time.Now().Add(h.cfg.FrameTimeout))
	}
	buf := getFrameBuf(h.cfg.MaxFrameBytes + 1)
	n, err := io.ReadFull(rd, *buf)
	if c.cork != nil {
		c.cork.endRead()
	}
	switch {
	case err == nil, errors.Is(err, errFrameWire):
		putFrameBuf(buf)
		c.closeNow(ClosePolicy, "frame too big")
		return false
	case errors.Is(err, os.ErrDeadlineExceeded):
		putFrameBuf(buf)
		c.closeNow(ClosePolicy, "frame too slow")
		return false
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
	default:
		putFrameBuf(buf)
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

// pingReceived is the connection's AcceptOptions.OnPingReceived: a
// WebSocket ping takes a token like any frame; the library answers it with
// a pong only when it got one. Reads outside the reader (a close
// handshake) carry no connection and are left to the library.
func pingReceived(ctx context.Context, _ []byte) bool {
	c, ok := ctx.Value(readContextKey{}).(*conn)
	return !ok || c.controlFrame()
}

// pongReceived is OnPongReceived: a pong takes a token too, whether it
// answers the server's ping or comes unasked.
func pongReceived(ctx context.Context, _ []byte) {
	if c, ok := ctx.Value(readContextKey{}).(*conn); ok {
		c.controlFrame()
	}
}

// controlFrame charges a ping or pong of the client to the frame bucket;
// false when it is over the rate. It runs inside coder/websocket's read,
// which holds the library's read lock, and a close handshake waits for
// that lock: so the over-rate client is closed by the writer
// (closeLocked), with 1008 like a data frame over the rate.
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
	c.readyAfterCheck(ctx, s, dialogID)
}

// recoverSub finishes a subscribe with sinceSeq whose channel is attached:
// the missed events, subscribed, then the live events that arrived
// meanwhile and are not among the replayed ones.
func (c *conn) recoverSub(s *sub, since int64) {
	h := c.hub
	rec, err := h.rec.recover(s.dialogID(), s.channel, since)
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
	for _, f := range s.pending {
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
	s.pending, s.pendingOverflow, s.pendingLost, s.ready, s.replayedUpTo = nil, false, false, true, upTo
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
	c.readyAfterCheck(ctx, s, dialogID)
}

// readyAfterCheck reads the dialog's lastSeq (checking membership with the
// same read) for an attached subscription and makes it ready, or detaches
// it with the error.
func (c *conn) readyAfterCheck(ctx context.Context, s *sub, dialogID string) {
	seq, err := c.hub.deps.Store.DialogLastSeq(ctx, dialogID, c.userID)
	if err != nil {
		c.hub.detach(c, dialogID)
		c.send(encodeError(subscribeErrCode(err)))
		return
	}
	c.ready(s, nil, seq, sinceAnswer{}, 0)
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
