package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// hubDeps are the collaborators a Hub calls.
type hubDeps struct {
	Store      *store.Store
	Subscriber *pubsub.Subscriber
	Publisher  *pubsub.Publisher
	Presence   *presence.Presence
	Verifier   TokenVerifier // refresh frames
	Recovery   recoveryReader
}

// Hub holds this instance's WebSocket connections and fans events out to
// them. Dispatch never blocks on a connection: it appends to the
// connection's bounded queue under that connection's lock. Safe for
// concurrent use.
type Hub struct {
	cfg    Config
	deps   hubDeps
	logger *slog.Logger
	stats  hubStats
	rec    *recoverer
	gate   *admission // handshakes' Redis and PostgreSQL work
	users  *userHandshakes
	frames *frameWorkers
	// creds is the budget of refused credentials of handshakes and
	// refresh frames (SetCredentialGate); nil for none.
	creds CredentialGate

	mu       sync.RWMutex // guards conns, channels, draining, remover
	conns    map[*conn]struct{}
	channels map[string]*members // Redis channel → its local subscribers
	draining bool
	remover  *drainRemover // set with draining: the teardowns' batched presence removal

	killed atomic.Bool    // connections end without presence cleanup (a crash)
	wg     sync.WaitGroup // connection goroutines
	empty  chan struct{}  // signalled when the last connection leaves
	// handshakes counts the handshakes under way (beginHandshake) until
	// each is a connection or its presence registration is taken back:
	// closeAll waits for them, so that the instance deregisters only after
	// the last of them (one that registered a moment before the drain and
	// is refused after it takes its registration back in an index that
	// still stands). stopping ends with the drain: a handshake waiting for
	// its user channel's subscription gives up at once.
	handshakes sync.WaitGroup
	stopping   context.Context
	stop       context.CancelFunc
}

func newHub(cfg Config, deps hubDeps, logger *slog.Logger) *Hub {
	h := &Hub{cfg: cfg, deps: deps, logger: logger, conns: map[*conn]struct{}{},
		channels: map[string]*members{}, empty: make(chan struct{}, 1)}
	h.rec = newRecoverer(&h.cfg, deps.Recovery)
	h.gate = newAdmission(cfg.HandshakeConcurrency, cfg.HandshakeQueue, cfg.HandshakeWait)
	h.users = newUserHandshakes(cfg.UserHandshakeRate, cfg.UserHandshakeBurst)
	h.frames = newFrameWorkers()
	h.stopping, h.stop = context.WithCancel(context.Background())
	return h
}

// beginHandshake counts a handshake under way (its end: the returned
// function, safe to call more than once); false once the hub drains.
func (h *Hub) beginHandshake() (end func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return nil, false
	}
	h.handshakes.Add(1)
	return sync.OnceFunc(h.handshakes.Done), true
}

// hubStats are the hub's counters; Prometheus reads them through
// collector functions (metrics.go).
type hubStats struct {
	overflows      atomic.Uint64
	slowCloses     atomic.Uint64
	ephemeralDrops atomic.Uint64
	coveredDrops   atomic.Uint64
	typingDrops    atomic.Uint64
	resyncs        atomic.Uint64
	framesIn       atomic.Uint64
	inlineWhole    atomic.Uint64
	inlineRest     atomic.Uint64
	maxQueue       atomic.Int64
	// conns and subs are the open connections and their dialog
	// subscriptions, kept beside the hub's maps (changed under h.mu) so a
	// metrics scrape reads them without taking any lock: a flood of
	// scrapes would otherwise hold the hub's lock, and every connect,
	// subscribe and delivery would wait behind it.
	conns   atomic.Int64
	subs    atomic.Int64
	closes  sync.Map // websocket.StatusCode → *atomic.Uint64
	rejects sync.Map // reason → *atomic.Uint64
	// refreshRejects counts refresh frames refused (conn.refresh), by the
	// reasons the handshake's rejects use for the same refusals.
	refreshRejects sync.Map // reason → *atomic.Uint64
}

func (s *hubStats) observeQueue(n int) {
	for {
		cur := s.maxQueue.Load()
		if int64(n) <= cur || s.maxQueue.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

func counter(m *sync.Map, k any) *atomic.Uint64 {
	v, _ := m.LoadOrStore(k, new(atomic.Uint64))
	return v.(*atomic.Uint64)
}

func (h *Hub) countClose(code websocket.StatusCode) { counter(&h.stats.closes, code).Add(1) }

func (h *Hub) countReject(reason string) { counter(&h.stats.rejects, reason).Add(1) }

func (h *Hub) countRefreshReject(reason string) { counter(&h.stats.refreshRejects, reason).Add(1) }

// Stats is a snapshot of the hub's state and counters.
type Stats struct {
	Connections        int
	Subscriptions      int    // dialog subscriptions over all connections
	QueueOverflows     uint64 // durable events replaced by a resync
	SlowConsumerCloses uint64
	EphemeralDrops     uint64
	CoveredDrops       uint64 // durable events dropped because a queued resync covers them
	TypingDrops        uint64
	Resyncs            uint64
	FramesIn           uint64
	MaxQueueFrames     int // the deepest any connection's queue has been
	// Queues written by the goroutine that filled them (conn.signalInline):
	// all their bytes taken by the socket at once, or the rest left to a
	// writer goroutine (the socket's send buffer was full).
	InlineWrites    uint64
	InlineLeftovers uint64
	Closes          map[int]uint64
	Rejects         map[string]uint64
	// RefreshRejects are the refresh frames refused, by reason:
	// auth_limited (the client's budget of refused credentials was spent,
	// the token not looked at), unauthorized (the token failed
	// verification), forbidden and user_mismatch (closed with 4003).
	RefreshRejects map[string]uint64
	// Recovery of subscribes with sinceSeq: reads made (and failed),
	// subscribes answered recovered true / false, and among the latter
	// those whose user had no recovery read left (RecoverReadRate,
	// RecoverReadBurst).
	RecoverReads        uint64
	RecoverReadErrors   uint64
	Recovered           uint64
	RecoverResyncs      uint64
	RecoverReadsRefused uint64
	// Handshake admission: handshakes holding a slot and waiting for one
	// now, the longest the queue has been, handshakes that waited and got a
	// slot (and their total wait), and refusals for a full queue or a wait
	// that ran out (also counted in Rejects).
	HandshakesActive     int
	HandshakesQueued     int
	HandshakeQueueMax    int
	HandshakeWaits       uint64
	HandshakeWaitSeconds float64
	HandshakeRefusedFull uint64
	HandshakeRefusedWait uint64
	// Subscribe checks (membership and lastSeq) and the PostgreSQL queries
	// that answered them: concurrent checks share one query.
	SubscribeChecks       uint64
	SubscribeCheckQueries uint64
}

// Stats returns the current counters.
func (h *Hub) Stats() Stats {
	st := Stats{
		QueueOverflows: h.stats.overflows.Load(), SlowConsumerCloses: h.stats.slowCloses.Load(),
		EphemeralDrops: h.stats.ephemeralDrops.Load(), CoveredDrops: h.stats.coveredDrops.Load(),
		TypingDrops: h.stats.typingDrops.Load(), Resyncs: h.stats.resyncs.Load(), FramesIn: h.stats.framesIn.Load(),
		MaxQueueFrames: int(h.stats.maxQueue.Load()),
		InlineWrites:   h.stats.inlineWhole.Load(), InlineLeftovers: h.stats.inlineRest.Load(), Closes: map[int]uint64{}, Rejects: map[string]uint64{},
		RefreshRejects:    map[string]uint64{},
		RecoverReadErrors: h.rec.readErrors.Load(),
		Recovered:         h.rec.recovered.Load(), RecoverResyncs: h.rec.resyncs.Load(), RecoverReadsRefused: h.rec.refused.Load(),
	}
	adm := h.gate.stats()
	st.HandshakesActive, st.HandshakesQueued, st.HandshakeQueueMax = adm.active, adm.queued, adm.queuedMax
	st.HandshakeWaits, st.HandshakeWaitSeconds = adm.waits, adm.waitSeconds
	st.HandshakeRefusedFull, st.HandshakeRefusedWait = adm.refusedFull, adm.refusedWait
	if h.deps.Store != nil {
		sc := h.deps.Store.SubscribeCheckStats()
		st.SubscribeChecks, st.SubscribeCheckQueries = sc.Checks, sc.Queries
	}
	h.stats.closes.Range(func(k, v any) bool {
		st.Closes[int(k.(websocket.StatusCode))] = v.(*atomic.Uint64).Load()
		return true
	})
	h.stats.rejects.Range(func(k, v any) bool {
		st.Rejects[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	h.stats.refreshRejects.Range(func(k, v any) bool {
		st.RefreshRejects[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	st.RecoverReads = h.rec.readsOK.Load() + st.RecoverReadErrors
	st.Connections = int(h.stats.conns.Load())
	st.Subscriptions = int(h.stats.subs.Load())
	return st
}

// add registers a connection (its goroutine is counted in wg) among the
// members of its user's channel, whose subscription reference the caller
// took, and sends hello: queued before the connection joins the members
// and written after, so it is the connection's first frame and every event
// dispatched on the channel from then on follows it. False while draining:
// then nothing is written.
func (h *Hub) add(c *conn, hello []byte) bool {
	ch := pubsub.UserChannel(c.userID)
	c.mu.Lock()
	c.enqueueLocked(outFrame{hello, classControl})
	c.mu.Unlock()
	h.mu.Lock()
	if h.draining {
		h.mu.Unlock()
		return false
	}
	h.wg.Add(1)
	h.conns[c] = struct{}{}
	h.stats.conns.Add(1)
	h.membersLocked(ch).add(c, nil)
	h.mu.Unlock()
	c.mu.Lock()
	c.signalInline()
	c.mu.Unlock()
	return true
}

// remove unregisters a connection and returns the channels it left (the
// caller releases their references) and, while the hub drains, the remover
// that takes the connection's presence removal.
func (h *Hub) remove(c *conn) ([]string, *drainRemover) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.conns[c]; !ok {
		return nil, h.remover
	}
	delete(h.conns, c)
	h.stats.conns.Add(-1)
	out := []string{pubsub.UserChannel(c.userID)}
	c.mu.Lock()
	for _, s := range c.subs {
		out = append(out, s.channel)
	}
	h.stats.subs.Add(-int64(len(c.subs)))
	c.subs, c.pendingBytes = nil, 0
	c.mu.Unlock()
	for _, ch := range out {
		h.leaveLocked(ch, c, nil, false)
	}
	if len(h.conns) == 0 {
		select {
		case h.empty <- struct{}{}:
		default:
		}
	}
	return out, h.remover
}

// attach adds a (not yet ready) dialog subscription on channel and returns
// it; nil if the connection is gone. The subscription keeps the channel
// name the channel's members already hold.
func (h *Hub) attach(c *conn, channel string) *sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.conns[c]; !ok {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	m := h.membersLocked(channel)
	s := &sub{channel: m.name}
	c.subs = append(c.subs, s)
	h.stats.subs.Add(1)
	c.mu.Unlock()
	m.add(c, s)
	return s
}

// detach removes a dialog subscription and releases its channel reference.
func (h *Hub) detach(c *conn, dialogID string) {
	h.mu.Lock()
	c.mu.Lock()
	s, i := c.subLocked(dialogID)
	if s != nil {
		c.subs = slices.Delete(c.subs, i, i+1)
		c.pendingBytes -= s.pendingBytes
		h.stats.subs.Add(-1)
		if len(c.subs) == 0 {
			c.subs = nil
		}
	}
	c.mu.Unlock()
	if s != nil {
		h.leaveLocked(s.channel, c, s, true)
	}
	h.mu.Unlock()
	if s != nil {
		h.deps.Subscriber.Unsubscribe(s.channel)
	}
}

// membersLocked is channel's members, created when missing. h.mu must be
// held for writing.
func (h *Hub) membersLocked(channel string) *members {
	m := h.channels[channel]
	if m == nil {
		m = &members{name: channel}
		h.channels[channel] = m
	}
	return m
}

// leaveLocked takes c out of channel's members (only while its
// subscription there is s, when onlyS) and forgets a channel left
// empty. h.mu must be held for writing.
//
// A channel left empty is unsubscribed, so the events published until a
// socket subscribes again never reach this instance: a recovery read of
// the dialog may no longer serve later subscribes (its kept events would
// lack them, and a joiner be told it is complete).
func (h *Hub) leaveLocked(channel string, c *conn, s *sub, onlyS bool) {
	m := h.channels[channel]
	if m == nil {
		return
	}
	if i := m.find(c); i >= 0 && (!onlyS || m.list[i].s == s) {
		m.removeAt(i)
	}
	if len(m.list) == 0 {
		delete(h.channels, channel)
		h.rec.forgetChannel(channel)
	}
}

// Dispatch forwards an event frame received on a Redis channel to every
// local subscriber, as is: the same bytes go to every socket.
func (h *Hub) Dispatch(channel string, payload []byte) {
	class := classify(payload)
	var seq int64
	if class == classDurable {
		seq = createdSeq(payload)
		h.rec.observe(channel, seq, payload)
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if m := h.channels[channel]; m != nil {
		// A few local subscribers get the event written right here
		// (conn.signalInline); a large fan-out goes to the connections'
		// writer goroutines, which write in parallel.
		inline := len(m.list) <= inlineFanout
		for _, e := range m.list {
			e.c.deliver(e.s, payload, class, seq, inline)
		}
	}
}

// inlineFanout: an event for at most this many local subscribers of its
// channel is written by the dispatching goroutine (Hub.Dispatch).
const inlineFanout = 16

// resyncChannels tells every connection subscribed to one of channels to
// reconcile (after the Pub/Sub link came back).
func (h *Hub) resyncChannels(channels []string, reason string) {
	h.rec.forget(channels)
	targets := map[*conn]struct{}{}
	h.mu.RLock()
	for _, ch := range channels {
		if m := h.channels[ch]; m != nil {
			for _, e := range m.list {
				targets[e.c] = struct{}{}
			}
		}
	}
	h.mu.RUnlock()
	for c := range targets {
		c.resync(reason)
	}
}

func (h *Hub) snapshot() []*conn {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*conn, 0, len(h.conns))
	for c := range h.conns {
		out = append(out, c)
	}
	return out
}

// presenceConns lists the local connections for the periodic heartbeat:
// none once the hub drains (they are all about to be removed).
func (h *Hub) presenceConns() []presence.Conn {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.draining {
		return nil
	}
	out := make([]presence.Conn, 0, len(h.conns))
	for c := range h.conns {
		c.mu.Lock()
		n := len(c.subs)
		c.mu.Unlock()
		out = append(out, presence.Conn{UserID: c.userID, ConnID: c.id, Subscriptions: n})
	}
	return out
}

// expiryResolution is the longest a connection outlives its credential's
// deadline: the ping loop checks every connection at least this often.
const expiryResolution = time.Second

// pingLoop is the one timer of every connection. Once per tick it asks each
// connection's writer for a WebSocket ping when PingInterval has passed
// since its last one was answered (connections are spread over the
// interval by their own start times), ends each connection whose pong has
// not come PongTimeout after its ping (or after the end of the handling of
// a client frame that held its pong unread), closes with 4001 token_expired each
// connection whose credential deadline (exp + the verifier's leeway) has
// passed, and starts the writer of each connection whose queued presence
// frames wait for it (at least every Config.PresenceDelay). The scan holds
// Hub.mu for reading and takes each connection's mu in turn (the lock
// order), so it allocates nothing and keeps nothing per connection: no
// goroutine, timer or list entry per connection. The waiting frames are
// written after the scan, with Hub.mu released (inline, as a dispatch
// writes them), into one slice the loop keeps between scans.
func (h *Hub) pingLoop(ctx context.Context) {
	tick := min(h.cfg.PingInterval/8, expiryResolution)
	if h.cfg.PresenceDelay > 0 {
		tick = min(tick, h.cfg.PresenceDelay)
	}
	t := time.NewTicker(max(tick, 10*time.Millisecond))
	defer t.Stop()
	var flush []*conn // connections whose queued frames wait for this scan
	var late []*conn  // connections whose pong did not come
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		nowNs := time.Now().UnixNano()
		mono := sinceStart()
		h.mu.RLock()
		for c := range h.conns {
			c.mu.Lock()
			switch {
			case c.closed:
			case nowNs >= c.expires:
				c.closeLocked(CloseUnauthorized, CloseReasonTokenExpired)
			case c.pongWait && !c.pingDue && !c.handlingLocked() && mono-c.lastPing >= h.cfg.PongTimeout:
				// No pong: the peer is gone or does not read. Closing
				// the socket ends the reader's wait, and its teardown
				// follows. Not before the ping is written (a batch the
				// client is slow to take may hold it back, within the
				// write timeout, which ends a client that takes
				// nothing): the wait counts from the write. Nor while
				// one of the client's frames is being handled: its pong
				// may wait unread behind it (a subscribe waiting on
				// PostgreSQL), and the wait counts again from the
				// frame's end (conn.endFrame).
				c.pongWait = false
				late = append(late, c)
			case !c.pongWait && mono-c.lastPing >= h.cfg.PingInterval:
				c.lastPing, c.pingDue, c.pongWait = mono, true, true
				c.signal()
			case len(c.q) > 0 && !c.writing:
				// Presence frames waiting for this scan: written
				// below, once Hub.mu is released.
				flush = append(flush, c)
			}
			c.mu.Unlock()
		}
		h.mu.RUnlock()
		for _, c := range flush {
			c.mu.Lock()
			c.signalInline()
			c.mu.Unlock()
		}
		clear(flush)
		flush = flush[:0]
		for _, c := range late {
			h.logger.Debug("websocket pong timeout", slog.String("connection", c.id))
			_ = c.cork.Conn.Close()
		}
		clear(late)
		late = late[:0]
	}
}

// retryReason is the 1001 close reason: the server-advised reconnect delay.
func (h *Hub) retryReason() string { return h.retryReasonAfter(0) }

// maxRetryAdvice is the longest reconnect delay a close reason advises,
// whatever the wait behind it: the longest a client honours (the SDK caps
// the advice there too), so a longer one would only tell a client to stay
// away for nothing.
const maxRetryAdvice = 5 * time.Minute

// retryReasonAfter is a close reason advising a reconnect after
// retryMsAfter(wait).
func (h *Hub) retryReasonAfter(wait time.Duration) string {
	return `{"retryMs":` + strconv.FormatInt(h.retryMsAfter(wait), 10) + `}`
}

// retryMsAfter is the delay advised to a client that must wait at least
// wait: wait plus a delay drawn from [RetryMin, RetryMax], in ms, at most
// maxRetryAdvice, so clients told to wait together come back spread out.
func (h *Hub) retryMsAfter(wait time.Duration) int64 {
	lo, hi := h.cfg.RetryMin.Milliseconds(), h.cfg.RetryMax.Milliseconds()
	ms := lo + rand.Int64N(hi-lo+1) + (min(wait, maxRetryAdvice) + time.Millisecond - 1).Milliseconds()
	return min(ms, maxRetryAdvice.Milliseconds())
}

// startDraining refuses new connections from now on and starts the
// batched presence removal of the connections that end, whose flushes end
// by ctx's deadline.
func (h *Hub) startDraining(ctx context.Context) *drainRemover {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.draining = true
	h.stop()
	if h.remover == nil {
		h.remover = newDrainRemover(h)
	}
	h.remover.bound(ctx)
	return h.remover
}

// drain stops accepting connections and closes the existing ones with 1001
// in batches, then waits until all are gone and their presence removed, or
// ctx ends.
func (h *Hub) drain(ctx context.Context) error {
	r := h.startDraining(ctx)
	conns := h.snapshot()
	// A user's sockets close in the same batch, so their removals tend to
	// share one script (drainremove.go).
	slices.SortFunc(conns, func(a, b *conn) int { return strings.Compare(a.userID, b.userID) })
	for i := 0; i < len(conns); i += h.cfg.DrainBatch {
		for _, c := range conns[i:min(i+h.cfg.DrainBatch, len(conns))] {
			c.closeWith(CloseGoingAway, h.retryReason())
		}
		if i+h.cfg.DrainBatch < len(conns) {
			t := time.NewTimer(h.cfg.DrainInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("gateway drain: %w", ctx.Err())
			case <-t.C:
			}
		}
	}
	for {
		h.mu.RLock()
		n := len(h.conns)
		h.mu.RUnlock()
		if n == 0 {
			if err := h.waitTeardowns(ctx); err != nil {
				return err
			}
			return r.finish(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gateway drain: %d connections left: %w", n, ctx.Err())
		case <-h.empty:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitTeardowns waits until every connection's teardown (its presence
// removal included) has finished: a connection leaves the hub's set before
// its presence is removed, so an empty set alone does not mean a drain is
// done.
func (h *Hub) waitTeardowns(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gateway drain: connection teardowns not finished: %w", ctx.Err())
	}
}

// closeAll ends every connection at once (after a drain, or a crash) and
// waits for their teardowns, presence removals included. The sockets are
// closed under the WebSocket library first: a connection in a close
// handshake (the drain's 1001 to a client that never answers) would hold
// the library's CloseNow until the handshake's own 5 s wait ends, one
// connection after another; with its socket closed, the handshake ends at
// once. The presence removals spend at most what is left of ctx.
func (h *Hub) closeAll(ctx context.Context) {
	r := h.startDraining(ctx)
	conns := h.snapshot()
	for _, c := range conns {
		_ = c.cork.Conn.Close()
	}
	for _, c := range conns {
		_ = c.ws.CloseNow()
		c.cancel()
	}
	// Handshakes still under way end as refusals now (add refuses while
	// the hub drains) and take their presence registrations back.
	h.handshakes.Wait()
	h.wg.Wait()
	r.stop()
	h.frames.stop()
}
