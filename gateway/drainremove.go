package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/store"
)

// Teardown during a drain. A connection that ends while the hub drains
// (Drain, or Close's closeAll) does not remove its own presence: it queues
// its (user, connection) here, and one goroutine removes what has queued
// every drainLinger (or every drainFlushMax connections) with
// presence.DisconnectMany — a script per user, hundreds per round trip —
// and records the users' last seen in one statement. Nor does it release
// its Pub/Sub channels: the instance's one Pub/Sub connection closes with
// the service, which ends every subscription at once, so per-channel
// UNSUBSCRIBEs would be wasted.
const (
	// drainLinger is how long the first queued removal waits for others.
	drainLinger = 20 * time.Millisecond
	// drainFlushMax: this many queued removals go out without waiting.
	drainFlushMax = 1024
	// drainFlushTimeout bounds one flush's Redis and PostgreSQL work, and
	// so does the deadline of the drain or shutdown under way: a flush
	// spends at most what is left of it. Removals a flush did not finish
	// are taken again while the instance lives and are otherwise left in
	// its index, which the survivors sweep.
	drainFlushTimeout = 5 * time.Second
)

// drainRemover batches the presence removals of a draining hub. Safe for
// concurrent use; started once, when the hub starts draining, and stopped
// by closeAll.
type drainRemover struct {
	h *Hub

	mu    sync.Mutex // guards queue, deadline
	queue []presence.Conn
	// deadline is that of the drain or shutdown under way (zero: none).
	// It is a deadline rather than a context: a Redis command that stalls
	// ends at its connection's deadline, not at a cancellation.
	deadline time.Time

	kick     chan struct{}      // something was queued
	flushReq chan chan struct{} // flush everything queued, then reply
	quit     chan struct{}      // closed by stop
	stopOnce sync.Once
	done     chan struct{} // closed when run returns
}

func newDrainRemover(h *Hub) *drainRemover {
	r := &drainRemover{h: h, kick: make(chan struct{}, 1), flushReq: make(chan chan struct{}),
		quit: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// bound makes the flushes from now on end by ctx's deadline (or only by
// their own budget when ctx has none).
func (r *drainRemover) bound(ctx context.Context) {
	d, _ := ctx.Deadline()
	r.mu.Lock()
	r.deadline = d
	r.mu.Unlock()
}

// add queues the removal of a connection that ended.
func (r *drainRemover) add(c presence.Conn) {
	r.mu.Lock()
	r.queue = append(r.queue, c)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *drainRemover) queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

func (r *drainRemover) run() {
	defer close(r.done)
	for {
		select {
		case <-r.kick:
			r.linger()
			r.flush()
		case reply := <-r.flushReq:
			r.flush()
			close(reply)
		case <-r.quit:
			r.flush()
			return
		}
	}
}

// linger waits up to drainLinger for more removals to queue.
func (r *drainRemover) linger() {
	t := time.NewTimer(drainLinger)
	defer t.Stop()
	for r.queued() < drainFlushMax {
		select {
		case <-t.C:
			return
		case <-r.kick:
		case <-r.quit:
			return
		}
	}
}

// flush removes everything queued.
func (r *drainRemover) flush() {
	r.mu.Lock()
	batch := r.queue
	r.queue = nil
	budget := drainFlushTimeout
	if !r.deadline.IsZero() {
		budget = min(budget, time.Until(r.deadline))
	}
	r.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	h := r.h
	// Past the deadline the context is done at once: DisconnectMany then
	// hands the removals on to be taken again later.
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	at, err := h.deps.Presence.DisconnectMany(ctx, batch)
	if err != nil {
		h.logger.Warn("presence removal of drained connections failed; they are removed again once Redis answers",
			slog.Int("connections", len(batch)), slog.String("kind", store.Kind(err)))
	}
	if at.IsZero() {
		// No removal answered, so Redis recorded no time: as after a
		// single disconnect, this host's clock does not stand in for it
		// (a last-seen time only moves forward); the users' offline
		// transitions record Redis's time.
		return
	}
	users := make([]string, 0, len(batch))
	seen := make(map[string]struct{}, len(batch))
	for _, c := range batch {
		if _, ok := seen[c.UserID]; !ok {
			seen[c.UserID] = struct{}{}
			users = append(users, c.UserID)
		}
	}
	if err := h.deps.Store.TouchLastSeenMany(ctx, users, at); err != nil {
		h.logger.Warn("last seen not recorded", slog.String("kind", store.Kind(err)))
	}
}

// finish returns once everything queued before the call is removed (or
// ctx ends).
func (r *drainRemover) finish(ctx context.Context) error {
	reply := make(chan struct{})
	select {
	case r.flushReq <- reply:
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gateway drain: presence removals not finished: %w", ctx.Err())
	}
	select {
	case <-reply:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gateway drain: presence removals not finished: %w", ctx.Err())
	}
}

// stop flushes what is queued and ends the goroutine. Idempotent.
func (r *drainRemover) stop() {
	r.stopOnce.Do(func() { close(r.quit) })
	<-r.done
}
