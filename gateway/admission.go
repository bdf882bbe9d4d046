package gateway

import (
	"container/list"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Handshake admission. A handshake's Redis and PostgreSQL work (ticket or
// token, the user row, the presence registration) runs under one of
// Config.HandshakeConcurrency slots, sized from the connection pools, so a
// reconnect storm of thousands of sockets does not pile its handshakes onto
// a 20-connection pool until they time out. A handshake that finds every
// slot taken waits in a FIFO queue of at most Config.HandshakeQueue
// handshakes, for at most Config.HandshakeWait; only a handshake that finds
// the queue full, or whose wait ends, is refused (1013 with a reconnect
// delay). The slot is held only for that work, never while writing to the
// client, so a client that never reads holds none.

var (
	// errAdmissionFull: the handshake queue was full on arrival.
	errAdmissionFull = errors.New("gateway: handshake queue full")
	// errAdmissionWait: the handshake waited HandshakeWait in the queue.
	errAdmissionWait = errors.New("gateway: handshake queue wait exceeded")
)

// admission is a counting semaphore with a bounded FIFO queue. Safe for
// concurrent use.
type admission struct {
	limit    int
	maxQueue int
	maxWait  time.Duration

	mu      sync.Mutex // guards active, waiters
	active  int        // slots held
	waiters list.List  // *admitWaiter, oldest first

	queuedMax   atomic.Int64  // the longest the queue has been
	waits       atomic.Uint64 // handshakes that waited and got a slot
	waitNanos   atomic.Uint64 // their total wait
	refusedFull atomic.Uint64
	refusedWait atomic.Uint64
}

// admitWaiter is one queued handshake; granted (under mu) and the closed
// ready channel say that release handed it a slot.
type admitWaiter struct {
	ready   chan struct{}
	granted bool
}

func newAdmission(limit, maxQueue int, maxWait time.Duration) *admission {
	return &admission{limit: limit, maxQueue: maxQueue, maxWait: maxWait}
}

// acquire takes a slot, waiting in the queue when none is free (after
// calling onWait, when not nil); it returns errAdmissionFull at once when
// the queue is full, errAdmissionWait when the wait ran out. Every nil
// return must be paired with one release.
func (a *admission) acquire(onWait func()) error {
	a.mu.Lock()
	if a.active < a.limit && a.waiters.Len() == 0 {
		a.active++
		a.mu.Unlock()
		return nil
	}
	if a.waiters.Len() >= a.maxQueue {
		a.mu.Unlock()
		a.refusedFull.Add(1)
		return errAdmissionFull
	}
	w := &admitWaiter{ready: make(chan struct{})}
	e := a.waiters.PushBack(w)
	a.observeQueueLocked()
	a.mu.Unlock()
	if onWait != nil {
		onWait()
	}

	start := time.Now()
	t := time.NewTimer(a.maxWait)
	defer t.Stop()
	select {
	case <-w.ready:
		a.countWait(start)
		return nil
	case <-t.C:
	}
	a.mu.Lock()
	if w.granted { // handed a slot as the wait ran out: take it
		a.mu.Unlock()
		a.countWait(start)
		return nil
	}
	a.waiters.Remove(e)
	a.mu.Unlock()
	a.refusedWait.Add(1)
	return errAdmissionWait
}

// release gives the slot to the oldest waiting handshake, or frees it.
func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if front := a.waiters.Front(); front != nil {
		w := a.waiters.Remove(front).(*admitWaiter)
		w.granted = true
		close(w.ready)
		return
	}
	a.active--
}

func (a *admission) observeQueueLocked() {
	if n := int64(a.waiters.Len()); n > a.queuedMax.Load() {
		a.queuedMax.Store(n) // under mu: no other writer
	}
}

func (a *admission) countWait(start time.Time) {
	a.waits.Add(1)
	a.waitNanos.Add(uint64(time.Since(start)))
}

// admissionStats is a snapshot of the admission's state and counters.
type admissionStats struct {
	active, queued, queuedMax int
	waits                     uint64
	waitSeconds               float64
	refusedFull, refusedWait  uint64
}

func (a *admission) stats() admissionStats {
	a.mu.Lock()
	active, queued := a.active, a.waiters.Len()
	a.mu.Unlock()
	return admissionStats{active: active, queued: queued, queuedMax: int(a.queuedMax.Load()),
		waits: a.waits.Load(), waitSeconds: time.Duration(a.waitNanos.Load()).Seconds(),
		refusedFull: a.refusedFull.Load(), refusedWait: a.refusedWait.Load()}
}
