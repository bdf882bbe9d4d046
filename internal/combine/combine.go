// Package combine shares round trips among concurrent callers: a Combiner
// executes the calls of many goroutines in shared batches (one pipeline,
// one statement), optionally after waiting for company (Linger, Company);
// a queued call leaves when its caller's context ends (DoCtx), and
// SharedContext gives such a batch a context that no single caller's
// leaving cuts short. It knows no Redis and no SQL: the
// batch's execution is the caller's function.
package combine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Combiner executes calls in shared batches: while InFlight batches are
// being executed, new calls queue; when one ends, the queued calls go out
// together as the next. A lone call is executed on its caller's goroutine,
// at once or after Linger; under load one execution carries many calls.
// The zero value is not usable: set Exec and Max. Safe for concurrent use.
type Combiner[C any] struct {
	// Exec executes one batch of at most Max calls, in order, and records
	// each call's outcome in the call itself.
	Exec func(batch []C)
	// InFlight is how many batches execute at once (at least 1).
	InFlight int
	// Max bounds one batch, but one caller's calls are never split
	// between batches: a batch may exceed Max by the rest of a caller's
	// calls.
	Max int
	// Linger is how long a call that finds a batch free waits for other
	// calls to join it before the batch is executed (0: at once). Calls
	// that arrive meanwhile queue behind it, and the batch leaves early
	// once they fill it.
	Linger time.Duration

	mu       sync.Mutex
	queue    []*waiter[C]
	inFlight int
	company  Company // a caller waiting for Linger
}

// waiter is one queued call.
type waiter[C any] struct {
	call C
	// more: the next queued waiter is the same caller's next call. A
	// caller's calls are taken into one batch together, never split: a
	// caller whose later call heads the next batch must not still be
	// waiting for its earlier call in a batch in flight.
	more bool
	// wake receives nil when the call was executed, or the batch this
	// caller must now execute (it holds the caller's own call).
	wake chan []*waiter[C]
}

// Do executes calls — together in one batch (with queued calls, up to Max)
// when a batch is free, else queued in order — and returns once each was
// executed.
func (c *Combiner[C]) Do(calls ...C) {
	ws := make([]*waiter[C], len(calls))
	for i, call := range calls {
		ws[i] = &waiter[C]{call: call}
	}
	for _, w := range ws[1:] {
		w.wake = make(chan []*waiter[C], 1)
	}
	c.mu.Lock()
	if c.freeLocked() {
		c.lead(ws)
		return
	}
	c.enqueueLocked(ws)
	c.mu.Unlock()
	for _, w := range ws {
		if batch := <-w.wake; batch != nil {
			c.send(batch)
		}
	}
}

// DoCtx executes calls as Do does, unless ctx ends while they are still
// queued: they then leave the queue unexecuted and DoCtx returns ctx's
// error, so a caller never waits past its own deadline for the batches in
// flight ahead of it (a stalled one would hold every queued caller). A
// caller's calls are taken into a batch together, so they leave together.
// Calls already taken into a batch, or leading one on this goroutine, are
// waited for and DoCtx returns nil: Exec records the outcome in the call,
// so its caller must not leave while the call may still be written; Exec
// bounds the batch (SharedContext).
func (c *Combiner[C]) DoCtx(ctx context.Context, calls ...C) error {
	if ctx.Done() == nil {
		c.Do(calls...)
		return nil
	}
	ws := make([]*waiter[C], len(calls))
	for i, call := range calls {
		ws[i] = &waiter[C]{call: call}
	}
	for _, w := range ws[1:] {
		w.wake = make(chan []*waiter[C], 1)
	}
	c.mu.Lock()
	if c.freeLocked() {
		c.lead(ws)
		return nil
	}
	c.enqueueLocked(ws)
	c.mu.Unlock()
	for i, w := range ws {
		var batch []*waiter[C]
		select {
		case batch = <-w.wake:
		case <-ctx.Done():
			return c.leave(ctx, ws[i:])
		}
		if batch != nil {
			c.send(batch)
		}
	}
	return nil
}

// leave takes the calls of ws that are still queued out of the queue and
// waits for the others, which were taken meanwhile: as a batch's members
// (woken with nil) or as the caller who executes the next batch, which
// holds other callers' calls too. It returns ctx's error when calls left,
// else nil.
func (c *Combiner[C]) leave(ctx context.Context, ws []*waiter[C]) error {
	var taken []*waiter[C]
	c.mu.Lock()
	for _, w := range ws {
		i := slices.Index(c.queue, w)
		if i < 0 {
			taken = append(taken, w)
			continue
		}
		// A fresh array: the taken batches may share the queue's.
		c.queue = append(c.queue[:i:i], c.queue[i+1:]...)
	}
	if len(c.queue) == 0 {
		c.queue = nil
	}
	c.mu.Unlock()
	for _, w := range taken {
		if batch := <-w.wake; batch != nil {
			c.send(batch)
		}
	}
	if len(taken) < len(ws) {
		return ctx.Err()
	}
	return nil
}

// enqueueLocked (c.mu held) queues one caller's calls, ws, together.
func (c *Combiner[C]) enqueueLocked(ws []*waiter[C]) {
	ws[0].wake = make(chan []*waiter[C], 1)
	for _, w := range ws[:len(ws)-1] {
		w.more = true
	}
	c.queue = append(c.queue, ws...)
	c.company.Joined(len(c.queue))
}

// freeLocked (c.mu held) reports whether a new call starts a batch of its
// own instead of queueing.
func (c *Combiner[C]) freeLocked() bool {
	return !c.company.Waiting() && c.inFlight < max(c.InFlight, 1)
}

// lead (c.mu held, released) executes ws, with the calls queued behind
// them, as a batch on the caller's goroutine, after waiting up to Linger
// for company, and returns once every call of ws was executed.
func (c *Combiner[C]) lead(ws []*waiter[C]) {
	// One caller's calls stay together even beyond Max: in the queue they
	// would wait for a batch in flight, and there may be none.
	c.inFlight++
	if c.Linger > 0 && len(ws) < c.Max {
		c.company.Wait(&c.mu, c.Linger, c.Max-len(ws))
	}
	batch := append(ws[:len(ws):len(ws)], c.takeLocked(max(c.Max-len(ws), 0))...)
	c.mu.Unlock()
	c.send(batch)
	for _, w := range ws[1:] {
		<-w.wake
	}
}

// Company is the wait of a caller that found its batch free and waits for
// other calls to queue behind it before the batch goes out. The zero value
// is idle. Its methods are called with the lock that guards the queue held.
type Company struct {
	full chan struct{} // closed by Joined once room calls queued
	room int
}

// Waiting reports whether a caller waits for company now: new calls then
// queue behind it instead of starting batches of their own.
func (c *Company) Waiting() bool { return c.full != nil }

// Wait waits, with mu released, up to d or until room calls have queued
// (Joined), and returns with mu held again.
func (c *Company) Wait(mu sync.Locker, d time.Duration, room int) {
	full := make(chan struct{})
	c.full, c.room = full, room
	mu.Unlock()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-full:
		t.Stop()
	}
	mu.Lock()
	if c.full == full {
		c.full = nil
	}
}

// Joined records that queued calls wait behind the waiting caller; once
// they fill its room, its wait ends early.
func (c *Company) Joined(queued int) {
	if c.full != nil && queued >= c.room {
		close(c.full)
		c.full = nil
	}
}

// takeLocked removes up to limit queued calls, and beyond limit the rest
// of the last one's caller's calls (a caller's calls stay together).
func (c *Combiner[C]) takeLocked(limit int) []*waiter[C] {
	n := min(len(c.queue), limit)
	for n > 0 && n < len(c.queue) && c.queue[n-1].more {
		n++
	}
	out := c.queue[:n:n]
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return out
}

// send executes batch, wakes its other callers, and hands the slot to the
// next queued caller with the batch it must execute (or frees the slot).
func (c *Combiner[C]) send(batch []*waiter[C]) {
	calls := make([]C, len(batch))
	for i, w := range batch {
		calls[i] = w.call
	}
	c.Exec(calls)
	for _, w := range batch[1:] {
		w.wake <- nil
	}
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.inFlight--
		c.mu.Unlock()
		return
	}
	batch = c.takeLocked(max(c.Max, 1))
	c.mu.Unlock()
	batch[0].wake <- batch
}

// SharedDeadline is the context of a batch shared by calls: it ends at
// the latest deadline among the calls' contexts (ctxOf), at most budget
// away, and is not canceled when any of them is — so no caller is cut
// short by another leaving. A caller queued behind batches in flight
// leaves at its own deadline (Combiner.DoCtx); one whose call is in the
// batch waits for it, at most until the latest deadline among its
// batch-mates'. Its values are those of the first call's context. For a
// batch that also carries work nobody waits for (it must run to its
// deadline whoever leaves).
func SharedDeadline[C any](calls []C, ctxOf func(C) context.Context, budget time.Duration) (context.Context, context.CancelFunc) {
	limit := time.Now().Add(budget)
	var latest time.Time
	for _, call := range calls {
		d, ok := ctxOf(call).Deadline()
		if !ok || d.After(limit) {
			latest = limit
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(ctxOf(calls[0])), latest)
}

// SharedContext is SharedDeadline that also ends once every one of the
// calls' contexts has ended and at least one was canceled: a batch that no
// caller waits for any more (they were canceled: an instance shutting
// down) stops at once instead of running out its deadline. When every
// caller's context ended by its deadline, the batch's own deadline (the
// latest of theirs) ends it as before, so it reads as past its budget, not
// as canceled. A call whose context can never end keeps the batch to its
// deadline.
func SharedContext[C any](calls []C, ctxOf func(C) context.Context, budget time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := SharedDeadline(calls, ctxOf, budget)
	for _, call := range calls {
		if ctxOf(call).Done() == nil {
			return ctx, cancel
		}
	}
	var left atomic.Int64
	var canceled atomic.Bool
	left.Store(int64(len(calls)))
	stops := make([]func() bool, len(calls))
	for i, call := range calls {
		c := ctxOf(call)
		stops[i] = context.AfterFunc(c, func() {
			if errors.Is(c.Err(), context.Canceled) {
				canceled.Store(true)
			}
			if left.Add(-1) == 0 && canceled.Load() {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
