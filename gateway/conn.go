package gateway

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

type outFrame struct {
	b     []byte
	class frameClass
}

// sub is one dialog subscription of a connection. Until ready (the
// subscribed frame is queued) its events wait in pending, so no event of a
// dialog reaches the client before its subscribed frame; pending is bounded
// as the outbound queue it goes to is, by QueueFrames, and its bytes count
// with the queue's and every other pending's against the connection's
// QueueBytes (conn.deliver, conn.pendingBytes). It is kept small: every
// idle connection holds one per dialog it follows (64 bytes).
type sub struct {
	// channel is the dialog's Redis channel, the same string for every
	// local subscriber of the dialog (the hub's members name); the dialog
	// id is its tail.
	channel    string
	pending    []outFrame
	lastTyping int64 // Unix ns of the last typing published
	// replayedUpTo: the recovery of this subscription replayed the
	// message.created events up to this seq; later copies are dropped.
	replayedUpTo    int64
	ready           bool
	pendingOverflow bool
	// pendingLost: the Pub/Sub link came back before the subscription was
	// ready; what it lost meanwhile needs a resync after subscribed.
	pendingLost bool
	// pendingBytes is the bytes of pending's frames, at most QueueBytes
	// (an int32 fits in the space the flags leave).
	pendingBytes int32
}

// dialogID is the subscription's dialog (no allocation: a part of channel).
func (s *sub) dialogID() string { return pubsub.DialogOfChannel(s.channel) }

// conn is one WebSocket connection. Its reader goroutine owns reads and the
// connection's lifetime. A writer goroutine runs only while there is
// something to write: queueing work starts one when none runs, and it exits
// once the queue is still empty after one yield, so an idle connection costs
// one goroutine (the reader) — docs/benchmarks.md. When the reader returns it marks the
// connection closed (no writer starts after that), closes the socket and
// waits for the running writer.
type conn struct {
	hub    *Hub
	ws     *websocket.Conn
	id     string
	userID string
	cork   *corkConn // the hijacked connection

	writer sync.WaitGroup // the running writer, if any
	// writeLoopFn is c.writeLoop, made once: a go statement on a method
	// call allocates a closure at every start, and a writer starts per
	// burst; starting this func value allocates nothing.
	writeLoopFn func()

	// state holds two flags in one word, which sits with the flags below
	// to keep the struct in a smaller size class (an idle connection holds
	// one): stateEnded, set by cancel (the connection is over, see
	// opContext), read without mu; and stateHandling, changed and read
	// under mu (beginRead, endFrame).
	state atomic.Uint32

	mu           sync.Mutex // guards everything below but frameFull
	writing      bool       // a writer goroutine runs
	resyncQueued bool       // a resync is queued and not yet taken by the writer
	pingDue      bool
	closed       bool
	flushDue     bool // the cork holds bytes an inline write left for the writer
	// closeStarted: the reading side has begun the close handshake
	// (closeNow); no later request may interrupt its reads (wakeReader).
	closeStarted bool
	// pongWait: a ping is due or written and no pong has come since; the
	// hub's scan ends the connection when it lasts PongTimeout from the
	// ping's write (pingDue stays set until the writer has written it:
	// a ping queued behind a batch the client is slow to take is not yet
	// the client's to answer).
	pongWait bool
	// reading: a frame worker is reading a client frame (beginRead to
	// endRead). A close asked for meanwhile waits for the frame's end
	// instead of cutting its reads short (wakeReader), so the close
	// handshake starts at a frame boundary.
	reading   bool
	overflows int32      // since overflowFrom; an int32 fits in the space the flags leave
	spare     []outFrame // a small batch slice kept for the next writer
	q         []outFrame
	// qBytes is what the connection holds for its client against
	// QueueBytes, beside pendingBytes: the bytes of q's frames, and of
	// those the writer has taken from q and not yet written (a batch it
	// may be blocked on, and what an inline write left in the cork:
	// signalInline). Taking a batch leaves them counted; they are
	// released as the writer writes them (writeBatch, recycle), so a
	// client that stops reading makes the server hold no more than
	// QueueBytes, however the frames are split between queue and writer.
	qBytes int
	// lastPing is when the last ping was due or written, on the clock of
	// sinceStart (monotonic, 8 bytes where a time.Time takes 24).
	lastPing time.Duration
	// expires (Unix ns) is when the credential stops being valid: its exp
	// plus the verifier's leeway. The ping loop closes the connection with
	// 4001 token_expired then; a refresh frame moves it.
	expires int64
	// closeCode is the websocket.StatusCode asked for (1000 to 4999), 0
	// for none: a uint16 leaves pendingBytes room in the word an int took.
	closeCode uint16
	// pendingBytes is the sum of the subscriptions' pendingBytes. Pending
	// events are kept only while it and qBytes together stay within
	// QueueBytes (deliver, enqueueLocked), so it fits an int32 (QueueBytes
	// is at most 1 GiB).
	pendingBytes int32
	closeReason  string
	// subs are the dialog subscriptions (at most MaxSubscriptions, most
	// often one or a few): a slice searched by dialog id costs a fraction
	// of a map's memory per idle connection.
	subs         []*sub
	overflowFrom int64 // Unix ns: start of the window overflows counts in

	// frameFull is when the inbound frame bucket is full again, on the
	// clock of sinceStart (takeFrame). Not guarded by mu: only the
	// goroutine reading the socket touches it (the reader, or the frame
	// worker it waits for).
	frameFull time.Duration
	// credSubject is the client as the budget of refused credentials
	// counts it (CredentialGate.Subject), named at the handshake: a
	// refresh frame asks and spends its budget. nil when the hub has no
	// such budget. Set before the reader starts and only read by it.
	credSubject *netip.Prefix
}

// lastNs is the latest time a Unix ns int64 holds (2262-04-11).
var lastNs = time.Unix(0, math.MaxInt64)

// expiresNs is t in Unix ns, saturated: UnixNano wraps past 2262, and a
// token whose exp lies beyond (9999999999 is a common "never") would read
// as long expired.
func expiresNs(t time.Time) int64 {
	if t.After(lastNs) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

func newConn(h *Hub, ws *websocket.Conn, cork *corkConn, userID string, expires time.Time) *conn {
	// The first ping comes between half a PingInterval and a whole one
	// after the connect: connections opened together (a storm, a load
	// test) would otherwise all fall due in the same scan of the hub, and
	// every interval after that, as one burst of pings and pongs.
	c := &conn{hub: h, ws: ws, cork: cork, id: ids.New(), userID: userID,
		lastPing: sinceStart() - rand.N(max(h.cfg.PingInterval/2, 1)), expires: expiresNs(expires)}
	c.writeLoopFn = c.writeLoop
	return c
}

// The flags of conn.state.
const (
	// stateEnded: the connection is over (cancel).
	stateEnded uint32 = 1 << iota
	// stateHandling: a frame worker is reading or answering a client
	// frame (beginRead to endFrame). The client's next frames, a pong
	// among them, wait unread meanwhile, so the hub's scan does not count
	// the wait for a pong against it (Hub.pingLoop).
	stateHandling
)

// cancel marks the connection over; whoever calls it also closes the
// socket, which ends any read, write or ping in progress (see opContext).
func (c *conn) cancel() { c.state.Or(stateEnded) }

// ended reports whether the connection is over (cancel).
func (c *conn) ended() bool { return c.state.Load()&stateEnded != 0 }

// handlingLocked reports whether a client frame is being read or answered
// (stateHandling). c.mu must be held.
func (c *conn) handlingLocked() bool { return c.state.Load()&stateHandling != 0 }

// subLocked is the subscription to dialogID and its index in subs, or nil
// and -1. c.mu must be held.
func (c *conn) subLocked(dialogID string) (*sub, int) {
	for i, s := range c.subs {
		if s.dialogID() == dialogID {
			return s, i
		}
	}
	return nil, -1
}

// closeLocked asks for the connection to be closed with code; the first
// request wins. The writer writes what it has taken, then wakes the reader,
// which performs the close handshake (closeNow): the reading side is the
// only one that reads the socket.
func (c *conn) closeLocked(code websocket.StatusCode, reason string) {
	if c.closeCode != 0 || c.closed {
		return
	}
	if code == CloseSlowConsumer {
		c.hub.stats.slowCloses.Add(1)
	}
	c.closeCode, c.closeReason = uint16(code), reason
	c.dropQueueLocked()
	c.signal()
}

// dropQueueLocked lets go of the queued frames. The batch the writer has
// taken stays counted in qBytes until it is done with it (conn.recycle).
// c.mu must be held.
func (c *conn) dropQueueLocked() {
	for _, f := range c.q {
		c.qBytes -= len(f.b)
	}
	c.q = nil
}

func (c *conn) closeWith(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	c.closeLocked(code, reason)
	c.mu.Unlock()
}

// closeNow performs the close handshake on the reading side (the reader,
// or the frame worker it waits for): with the close asked for first, or
// with code when none was. Only the first call does anything.
func (c *conn) closeNow(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	first := !c.closeStarted && !c.closed
	if first {
		c.closeStarted = true
		if c.closeCode == 0 {
			c.closeCode, c.closeReason = uint16(code), reason
			c.dropQueueLocked()
		}
		code, reason = websocket.StatusCode(c.closeCode), c.closeReason
	}
	c.mu.Unlock()
	if !first {
		return
	}
	c.hub.countClose(code)
	// A wake-up (wakeReader) may have left a deadline in the past; none
	// comes after closeStarted, and the handshake reads the client's
	// close frame, within its own bounds.
	c.hub.boundCloseRead(c.cork)
	// A writer mid-batch would otherwise buffer the close frame and drop
	// it when its next write fails: the client would see EOF instead of
	// the close code.
	_ = c.cork.seal(time.Now().Add(c.hub.cfg.WriteTimeout))
	_ = c.ws.Close(code, reason)
}

// closeAsked reports whether a close was asked for that the reading side
// has not begun.
func (c *conn) closeAsked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeCode != 0 && !c.closeStarted && !c.closed
}

// wakeReader ends the reader's wait for the next frame with a read
// deadline in the past, so it finds the close asked for (closeAsked). A
// frame being read is left whole: cut off in its middle, its remaining
// bytes would be read by the close handshake as frames (a protocol error,
// and a socket closed on unread bytes instead of the close code); the
// reader finds the close once the frame is in (at most FrameTimeout).
// Under c.mu with closeStarted and reading: no deadline lands in the
// handshake's reads or a frame's.
func (c *conn) wakeReader() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closeStarted && !c.closed && !c.reading {
		_ = c.cork.Conn.SetReadDeadline(pastDeadline)
	}
}

// beginRead bounds the reads of one client frame (corkConn.limitRead) and
// marks it as being read, so that wakeReader leaves it whole. A wake-up
// just before is overridden by the frame's deadline; the reader finds the
// close after the frame (waitFrame).
func (c *conn) beginRead(n int, deadline time.Time) {
	c.mu.Lock()
	c.reading = true
	c.state.Or(stateHandling)
	c.mu.Unlock()
	c.cork.limitRead(n, deadline)
}

// endRead lifts the frame's bounds (corkConn.endRead); from now on a close
// asked for ends the reader's wait.
func (c *conn) endRead() {
	c.cork.endRead()
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
}

// endFrame marks the end of a client frame's handling (from beginRead:
// its read and its answer, a subscribe's PostgreSQL and Redis work
// included). A ping the client had to answer meanwhile gets its whole
// PongTimeout from now: its pong could not be read before, queued behind
// the frames the server was busy with.
func (c *conn) endFrame() {
	c.mu.Lock()
	c.state.And(^stateHandling)
	if c.pongWait {
		c.lastPing = sinceStart()
	}
	c.mu.Unlock()
}

// pastDeadline is a read deadline that has passed: set, it fails the read
// in progress and every later one until cleared.
var pastDeadline = time.Unix(1, 0)

// teardown runs once the reader returned: stop the writer, leave every
// channel, and record the disconnect in presence and PostgreSQL; while the
// hub drains, the last two are batched with the other teardowns'.
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
	// The connection holds nothing for its client any more: the queue
	// is gone, and the writer released its batch or never took it.
	c.mu.Lock()
	c.qBytes = 0
	c.mu.Unlock()
	channels, drained := h.remove(c)
	if h.killed.Load() {
		return
	}
	if drained != nil {
		// The Pub/Sub connection closes with the service; the
		// presence removal joins the others' (drainremove.go).
		drained.add(presence.Conn{UserID: c.userID, ConnID: c.id})
		return
	}
	for _, ch := range channels {
		h.deps.Subscriber.Unsubscribe(ch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	at, err := h.deps.Presence.Disconnect(ctx, c.userID, c.id)
	if err != nil {
		h.logger.Warn("presence disconnect failed; it is done again once Redis answers",
			slog.String("connection", c.id), slog.String("kind", store.Kind(err)))
	}
	if at.IsZero() {
		// Redis recorded no time. The last-seen time only moves forward,
		// so this host's clock, which may be ahead, must not stand in for
		// it; the user's offline transition records Redis's time.
		return
	}
	if err := h.deps.Store.TouchLastSeen(ctx, c.userID, at); err != nil {
		h.logger.Warn("last seen not recorded", slog.String("kind", store.Kind(err)))
	}
}

// opContext bounds one operation of a connection. It deliberately does not
// derive from a per-connection context: every context derived from a
// cancellable parent allocates the parent's done channel and children map,
// and coder/websocket registers a context.AfterFunc for the blocking read of
// every idle connection — together ≈ 1.4 KiB per idle connection
// (docs/benchmarks.md). Instead, whoever cancels the connection (abort,
// teardown, Hub.closeAll, the writer after a close handshake) also closes
// the socket, which ends any read, write or ping in progress; conn.ended
// only tells the writer the end was deliberate.
func opContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
