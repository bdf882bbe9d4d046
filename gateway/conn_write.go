package gateway

import (
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/han-app/gateway/store"
)

// writeLoop drains the queue: it takes everything queued, writes it as one
// batch (one syscall through the cork), and exits when the queue is still
// empty after one yield (signal starts the next writer). It also sends the
// WebSocket pings the hub asks for, and for a close the hub decides on
// (drain, slow consumer, expiry) it writes what it has taken and wakes the
// reader, which performs the close handshake. A writer that stops on an
// error leaves writing set, so no other writer starts on the failed
// connection. One that stops because the connection is closing (a close
// frame is being or was written) leaves the close to whoever started it:
// closing the socket now could cut that close frame off.
func (c *conn) writeLoop() {
	defer c.writer.Done()
	yielded := false
	for {
		c.mu.Lock()
		if c.ended() {
			c.mu.Unlock()
			return
		}
		if len(c.q) == 0 && !c.pingDue && c.closeCode == 0 && !c.flushDue {
			if !yielded {
				// During a fan-out burst the next frame is usually being
				// queued right now: yield once and look again before
				// exiting, so a burst does not start and end a writer per
				// frame. It holds no memory an exit would free.
				yielded = true
				c.mu.Unlock()
				runtime.Gosched()
				continue
			}
			c.writing = false
			c.mu.Unlock()
			return
		}
		yielded = false
		// The batch's bytes stay in qBytes, counted against QueueBytes
		// with what is queued after it, until they are written.
		batch, flush, taken := c.q, c.flushDue, c.qBytes
		c.q, c.resyncQueued, c.flushDue = c.spare, false, false
		c.spare = nil
		// pingDue stays set until the ping is written (below): the pong
		// wait counts from then, not from while the batch ahead of it
		// waited for the client to take it.
		ping := c.pingDue
		code := c.closeCode
		c.mu.Unlock()
		held, err := c.writeBatch(batch, flush, taken)
		// Written or never to be: either way the server no longer holds
		// the batch for the client.
		c.recycle(batch, held)
		if err != nil {
			if !errors.Is(err, errDataAfterClose) {
				c.abort(err)
			}
			return
		}
		if code != 0 {
			// The reader performs the close (closeNow); this writer
			// stays marked as running, so no other starts.
			c.wakeReader()
			return
		}
		if ping {
			// The pong is the reading side's to see (conn.pong); the
			// hub's scan ends the connection when it does not come.
			if err := c.cork.writeControl(opPing, nil, time.Now(), c.hub.cfg.WriteTimeout); err != nil {
				c.abort(err)
				return
			}
			c.mu.Lock()
			c.pingDue = false
			if c.pongWait {
				c.lastPing = sinceStart()
			}
			c.mu.Unlock()
		}
	}
}

// writeBatch writes a batch through the cork: a write deadline on the
// socket that gives the whole batch at least the write timeout (kept from
// an earlier batch when enough of it is left: cork), the frames encoded straight
// into the cork's buffer (no per-frame locking, context or timer in
// coder/websocket), and one write syscall per corkFlushBytes. flush: the
// cork holds bytes an inline write left (conn.signalInline), which go first.
// A batch that misses its deadline is a slow consumer.
//
// taken is what the batch counts in qBytes (against QueueBytes). The
// frames a flush in the middle of the batch has put on the socket stop
// counting then, so a client that reads, if slowly, frees room for the
// events behind the batch as it goes; held is what still counts when the
// batch ends, for the caller to release.
func (c *conn) writeBatch(batch []outFrame, flush bool, taken int) (held int, err error) {
	if len(batch) == 0 && !flush {
		return taken, nil
	}
	err = c.cork.cork(time.Now(), c.hub.cfg.WriteTimeout)
	collected := 0 // the bytes of the frames collected since the last flush
	for i := 0; err == nil && i < len(batch); i++ {
		var n int
		if n, err = c.cork.writeText(batch[i].b); err != nil {
			break
		}
		collected += len(batch[i].b)
		if n >= corkFlushBytes {
			if err = c.cork.flush(); err == nil {
				c.releaseBytes(collected)
				taken, collected = taken-collected, 0
			}
		}
	}
	if err != nil {
		c.cork.discard()
	} else {
		err = c.cork.uncork()
	}
	if err != nil && !c.ended() && isTimeout(err) {
		c.hub.stats.slowCloses.Add(1)
	}
	return taken, err
}

// releaseBytes stops counting n bytes the writer has written against
// QueueBytes.
func (c *conn) releaseBytes(n int) {
	c.mu.Lock()
	c.qBytes -= n
	c.mu.Unlock()
}

// keptBatch is the largest batch slice a connection keeps for its next
// batch; larger ones (bursts) go to batchPool, so an idle connection holds
// little memory and a burst does not grow a new queue frame by frame.
const keptBatch = 16

// batchPool holds the batch slices of bursts (*[]outFrame, empty).
var batchPool sync.Pool

// recycle ends a batch the writer is done with: the held bytes it still
// counted against QueueBytes are released, and its slice is kept for the
// next batch or pooled.
func (c *conn) recycle(batch []outFrame, held int) {
	kept := releaseBatch(batch)
	c.mu.Lock()
	c.qBytes -= held
	if kept != nil && c.spare == nil && !c.closed {
		c.spare = kept
	}
	c.mu.Unlock()
}

// releaseBatch empties a written batch's slice: a small one (≤ keptBatch)
// comes back empty for the connection to keep, a larger one goes to
// batchPool and nil comes back.
func releaseBatch(batch []outFrame) []outFrame {
	clear(batch)
	if cap(batch) > keptBatch {
		b := batch[:0]
		batchPool.Put(&b)
		return nil
	}
	return batch[:0]
}

// growQueueLocked moves a full queue of at least keptBatch frames into a
// larger pooled slice, if the pool has one; otherwise append grows it.
// c.mu must be held.
func (c *conn) growQueueLocked() {
	p, ok := batchPool.Get().(*[]outFrame)
	if !ok {
		return
	}
	if cap(*p) <= len(c.q) {
		batchPool.Put(p) // too small for this queue; another burst may use it
		return
	}
	old := c.q
	c.q = append((*p)[:0], old...)
	clear(old)
	if c.spare == nil && cap(old) <= keptBatch {
		c.spare = old[:0]
	}
}

// abort ends a connection whose writer failed (write timeout, dead peer).
func (c *conn) abort(err error) {
	if !c.ended() {
		c.hub.logger.Debug("websocket writer stopped", slog.String("connection", c.id), slog.String("kind", store.Kind(err)))
	}
	_ = c.ws.CloseNow()
	c.cancel()
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
