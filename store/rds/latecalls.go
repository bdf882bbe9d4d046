package rds

import (
	"sync"
	"sync/atomic"
	"time"
)

// LateCalls keeps what calls that got no reply may have done, to be undone
// once Redis answers again: a Redis that stalls instead of failing runs the
// calls it had received when it wakes, after their callers gave up. Each
// entry lives until its own deadline (when what the call did would lapse by
// itself) and, once an undo found nothing to undo, for Settle more: the
// late call may not have run yet. Take hands out the live entries at most
// once per Every; Keep and Settling put back those still to undo. The list is bounded
// (Max): past it a late call's effect is left to lapse by itself. Safe for
// concurrent use; Take costs one atomic load while the list is empty.
type LateCalls[T any] struct {
	Max    int
	Every  time.Duration
	Settle time.Duration

	n     atomic.Int32 // len(items), read without mu
	mu    sync.Mutex   // guards items, next
	items []LateCall[T]
	next  time.Time // no Take hands anything out before this
}

// LateCall is one remembered call.
type LateCall[T any] struct {
	V               T
	until, settleBy time.Time
}

// Add remembers v for life.
func (u *LateCalls[T]) Add(v T, life time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.items) < u.Max {
		u.items = append(u.items, LateCall[T]{V: v, until: time.Now().Add(life)})
		u.n.Store(int32(len(u.items)))
	}
}

// Take removes and returns every live entry, dropping those whose time is
// up; nil when the list is empty or the last Take was less than Every ago.
// A caller that handles only some of them (those on one master, a batch)
// puts the others back with Keep.
func (u *LateCalls[T]) Take(now time.Time) []LateCall[T] {
	if u.n.Load() == 0 {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.items) == 0 || now.Before(u.next) {
		return nil
	}
	u.next = now.Add(u.Every)
	var live []LateCall[T]
	for _, e := range u.items {
		if now.After(e.until) || (!e.settleBy.IsZero() && now.After(e.settleBy)) {
			continue
		}
		live = append(live, e)
	}
	u.items = nil
	u.n.Store(0)
	return live
}

// Settling puts back entries whose undo found nothing to undo: each is kept
// Settle more at most, from its first such undo.
func (u *LateCalls[T]) Settling(now time.Time, es ...LateCall[T]) {
	for i := range es {
		if es[i].settleBy.IsZero() {
			es[i].settleBy = now.Add(u.Settle)
		}
	}
	u.Keep(es...)
}

// Keep puts back entries still to undo (not tried, or the undo failed),
// ahead of any added meanwhile.
func (u *LateCalls[T]) Keep(es ...LateCall[T]) {
	if len(es) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.items = append(es, u.items...)
	if len(u.items) > u.Max {
		u.items = u.items[:u.Max]
	}
	u.n.Store(int32(len(u.items)))
}
