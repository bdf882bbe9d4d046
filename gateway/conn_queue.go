package gateway

import (
	"bytes"
	"time"
)

// signal makes sure a writer runs to pick up what was just queued. c.mu must
// be held.
func (c *conn) signal() {
	if c.writing || c.closed {
		return
	}
	c.writing = true
	c.writer.Add(1)
	go c.writeLoopFn()
}

// signalInline gets what was just queued written: on this goroutine, in
// one write(2) that never blocks (corkConn.tryWrite), when no writer runs
// and the queue is small; otherwise, or for what the socket did not take,
// by a writer goroutine as signal starts it. A connection that gets an
// event now and then is then served without a goroutine start and the
// scheduler's wake-up of an idle thread to run it. c.mu must be held; the
// write happens under it, which is what keeps other writes out.
func (c *conn) signalInline() {
	if c.writing || c.closed || len(c.q) == 0 {
		return
	}
	if !c.pingDue && c.closeCode == 0 && len(c.q) <= inlineFrames && c.qBytes <= inlineBytes {
		if sent, rest := c.cork.tryWrite(c.q, time.Now(), c.hub.cfg.WriteTimeout); sent {
			c.q, c.resyncQueued = releaseBatch(c.q), false
			if !rest {
				c.qBytes = 0
				c.hub.stats.inlineWhole.Add(1)
				return
			}
			// What the socket did not take waits in the cork: the
			// frames' bytes count against QueueBytes until the writer
			// has written it (those the socket took count too, at
			// most inlineBytes in all, for as long).
			c.hub.stats.inlineRest.Add(1)
			c.flushDue = true
		}
	}
	c.signal()
}

// The most a connection's queue may hold to be written inline
// (signalInline); more goes to a writer goroutine.
const (
	inlineFrames = keptBatch
	inlineBytes  = 16 << 10
)

// deliver queues a fanned-out frame for s (nil: the user's own channel);
// seq is the frame's seq when it is a message.created event, else 0. A
// message.created event the subscription's recovery replayed already is
// dropped: its publish may come after the recovery read. inline lets this
// goroutine write the frame itself (signalInline). It never blocks.
func (c *conn) deliver(s *sub, b []byte, class frameClass, seq int64, inline bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || (s != nil && seq > 0 && seq <= s.replayedUpTo) {
		return
	}
	if s != nil && !s.ready {
		// Held as the outbound queue would hold them, within its frame
		// bound, and within the connection's bytes: the queue's and every
		// subscription's pending together stay within QueueBytes, however
		// many dialogs the connection subscribes to. What does not fit is
		// dropped with the rest of this subscription's, and ready follows
		// the subscribed frame with a resync.
		switch cfg := &c.hub.cfg; {
		case class.ephemeral():
			c.hub.stats.ephemeralDrops.Add(1)
		case s.pendingOverflow:
		case len(s.pending) >= cfg.QueueFrames || c.qBytes+int(c.pendingBytes)+len(b) > cfg.QueueBytes:
			c.dropPendingLocked(s)
		default:
			s.pending = append(s.pending, outFrame{b, class})
			// Both fit: the total is at most QueueBytes.
			s.pendingBytes += int32(len(b))
			c.pendingBytes += int32(len(b))
		}
		return
	}
	if !c.enqueueLocked(outFrame{b, class}) {
		return
	}
	if inline {
		c.signalInline()
	} else {
		c.signal()
	}
}

// send queues a control frame (written inline when it can be).
func (c *conn) send(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && c.enqueueLocked(outFrame{b, classControl}) {
		c.signalInline()
	}
}

// enqueueLocked applies the backpressure policy: ephemeral frames are
// dropped once the queue is half full; a durable event that does not fit
// replaces every queued event with one resync; durable events arriving
// while that resync waits are covered by it and dropped. It reports whether
// f was queued for a writer to pick up now; the caller then signals.
func (c *conn) enqueueLocked(f outFrame) bool {
	cfg := &c.hub.cfg
	switch f.class {
	case classEphemeral, classPresence:
		if 2*len(c.q) >= cfg.QueueFrames || 2*(c.qBytes+len(f.b)) > cfg.QueueBytes {
			c.hub.stats.ephemeralDrops.Add(1)
			return false
		}
	case classDurable:
		if c.resyncQueued {
			c.hub.stats.coveredDrops.Add(1)
			return false
		}
		full := func() bool { return len(c.q) >= cfg.QueueFrames || c.qBytes+len(f.b) > cfg.QueueBytes }
		if full() {
			c.dropEphemeralLocked()
			if full() {
				c.overflowLocked()
				return false
			}
		}
	case classControl:
		// Control frames answer the client's own requests, which the
		// inbound frame rate bounds; a client that sends requests but never
		// reads the answers fills this margin and is closed.
		if len(c.q) >= cfg.QueueFrames+cfg.FrameBurst {
			c.closeLocked(CloseSlowConsumer, "slow consumer")
			return false
		}
	}
	if c.pendingBytes > 0 && c.qBytes+int(c.pendingBytes)+len(f.b) > cfg.QueueBytes {
		c.shedPendingLocked()
	}
	if len(c.q) == cap(c.q) && len(c.q) >= keptBatch {
		c.growQueueLocked()
	}
	c.q = append(c.q, f)
	c.qBytes += len(f.b)
	c.hub.stats.observeQueue(len(c.q))
	if f.class == classPresence && cfg.PresenceDelay > 0 && len(c.q) < lingerFrames {
		// The hub's scan (pingLoop) starts the writer within
		// PresenceDelay, unless another frame does first.
		return false
	}
	return true
}

// dropEphemeralLocked makes room for a durable event in a full queue: the
// queued ephemeral frames (typing, presence.changed, which may be waiting
// for the hub's scan) go first, so they never cost a resync.
func (c *conn) dropEphemeralLocked() {
	kept := c.q[:0]
	for _, f := range c.q {
		if f.class.ephemeral() {
			c.qBytes -= len(f.b)
		} else {
			kept = append(kept, f)
		}
	}
	n := len(c.q) - len(kept)
	clear(c.q[len(kept):])
	c.q = kept
	c.hub.stats.ephemeralDrops.Add(uint64(n))
}

// dropPendingLocked lets go of what s holds until it is ready; ready
// follows its subscribed frame with a resync. c.mu must be held.
func (c *conn) dropPendingLocked(s *sub) {
	c.pendingBytes -= s.pendingBytes
	s.pending, s.pendingBytes, s.pendingOverflow = nil, 0, true
}

// shedPendingLocked makes room in the connection's bytes for a frame the
// outbound queue takes: the events held by subscriptions not yet ready go,
// each of those subscriptions getting a resync after its subscribed frame,
// as when its own events overflow. A live dialog's events thus never give
// way to a waiting one's. c.mu must be held.
func (c *conn) shedPendingLocked() {
	for _, s := range c.subs {
		if len(s.pending) > 0 {
			c.dropPendingLocked(s)
		}
	}
}

// lingerFrames: once a connection's queue holds this many frames, a
// presence frame no longer waits for the hub's scan.
const lingerFrames = 32

func (c *conn) overflowLocked() {
	h := c.hub
	h.stats.overflows.Add(1)
	kept := c.q[:0]
	for _, f := range c.q {
		if f.class == classControl {
			kept = append(kept, f)
		} else {
			c.qBytes -= len(f.b)
		}
	}
	clear(c.q[len(kept):])
	c.q = kept
	now := time.Now().UnixNano()
	if c.overflowFrom == 0 || time.Duration(now-c.overflowFrom) > h.cfg.OverflowWindow {
		c.overflowFrom, c.overflows = now, 0
	}
	c.overflows++
	if int(c.overflows) > h.cfg.MaxOverflows {
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

// resyncLastLocked moves the queued resync of every dialog (the one
// resyncQueued stands for) to the end of the queue, behind the frames
// queued after it. c.mu must be held.
func (c *conn) resyncLastLocked() {
	for i := len(c.q) - 1; i >= 0; i-- {
		if f := c.q[i]; f.class == classControl && bytes.HasPrefix(f.b, resyncPrefix) && !bytes.Contains(f.b, dialogIDField) {
			copy(c.q[i:], c.q[i+1:])
			c.q[len(c.q)-1] = f
			return
		}
	}
}

var (
	resyncPrefix  = []byte(`{"type":"resync",`)
	dialogIDField = []byte(`"dialogId":`)
)

// resync queues a resync for every dialog: the Pub/Sub link came back,
// and what was published while it was down never reached this instance.
// A subscription not yet ready may have lost events too, but its
// subscribed frame comes after this resync, so the resync does not cover
// it: ready queues another one after that frame.
func (c *conn) resync(reason string) {
	c.mu.Lock()
	for _, s := range c.subs {
		if !s.ready {
			s.pendingLost = true
		}
	}
	c.queueResyncLocked(reason)
	c.mu.Unlock()
}
