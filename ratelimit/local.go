package ratelimit

import (
	"sync"
	"time"
)

// local is the in-process conservative limiter used when Redis cannot
// decide for a FallbackLocal route: one token bucket per (route, family,
// subject) holding a fraction of the normal limit, refilled over the window.
// Each instance limits on its own, which is why the fraction is small. The
// map holds at most max buckets: when it is full, buckets that have refilled
// completely (the same as absent) are dropped, and if it is still full a new
// identity is denied (conservative) rather than letting churn reset others.
//
// A full map is swept at most once per sweepEvery, the time a newcomer it
// denies is told to wait. A sweep looks at every bucket under the lock that
// every fallback decision takes; run for each newcomer, a client that
// rotates identities (a host with a /48 has 65,536 IPv6 /64s) while Redis
// is down would make every request of the instance queue behind passes
// over the whole map.
type local struct {
	fraction float64
	max      int

	mu        sync.Mutex // guards the fields below
	buckets   map[string]*localBucket
	nextSweep time.Time // a full map is not swept before this
	sweeps    int       // sweeps run
}

// sweepEvery is how often a full map may be swept.
const sweepEvery = time.Second

type localBucket struct {
	tokens float64
	last   time.Time
	cap    float64
	window time.Duration
}

func newLocal(fraction float64, max int) *local {
	return &local{fraction: fraction, max: max, buckets: make(map[string]*localBucket)}
}

// localRule scales a rule down to its local quota (at least 1).
func (l *local) localRule(r Rule) Rule {
	n := int(float64(r.Limit) * l.fraction)
	if n < 1 {
		n = 1
	}
	r.Limit = n
	return r
}

func (b *localBucket) level(now time.Time) float64 {
	el := now.Sub(b.last)
	if el < 0 {
		el = 0
	}
	t := b.tokens + b.cap*float64(el)/float64(b.window)
	if t > b.cap {
		t = b.cap
	}
	return t
}

// resize gives the bucket the quota of a changed policy (the window is part
// of the key, so in practice only the limit changes). As in Redis's token
// bucket the new rate counts from the last admission and the level is capped
// by the new capacity (level does both), so a lowered limit applies at once.
// Caller holds mu.
func (b *localBucket) resize(capacity float64, window time.Duration) {
	b.tokens = min(b.tokens, capacity)
	b.cap, b.window = capacity, window
}

// msUntil is how long until the bucket holds `want` tokens.
func (b *localBucket) msUntil(level, want float64) int64 {
	if level >= want {
		return 0
	}
	d := time.Duration((want - level) / b.cap * float64(b.window))
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond < d {
		ms++
	}
	return ms
}

// decide evaluates the families all or nothing, like the Redis scripts.
func (l *local) decide(label string, keys []string, rules []Rule, now time.Time) Decision {
	nowMs := now.UnixMilli()
	d := Decision{NowMs: nowMs, Local: true, Allowed: true, Families: make([]FamilyDecision, len(rules))}
	l.mu.Lock()
	defer l.mu.Unlock()
	bs := make([]*localBucket, len(rules))
	levels := make([]float64, len(rules))
	for i, r := range rules {
		lr := l.localRule(r)
		d.Families[i].Rule = lr
		k := label + "\x00" + keys[i]
		b := l.buckets[k]
		if b == nil {
			if len(l.buckets) >= l.max && !now.Before(l.nextSweep) {
				l.sweep(now)
			}
			if len(l.buckets) >= l.max {
				// Full of active identities: deny the newcomer for a second.
				d.Allowed = false
				d.Families[i].ResetAtMs = nowMs + sweepEvery.Milliseconds()
				continue
			}
			b = &localBucket{tokens: float64(lr.Limit), last: now, cap: float64(lr.Limit), window: r.Window}
		} else if b.cap != float64(lr.Limit) || b.window != r.Window {
			b.resize(float64(lr.Limit), r.Window)
		}
		bs[i] = b
		levels[i] = b.level(now)
		if levels[i] < 1 {
			d.Allowed = false
			d.Families[i].ResetAtMs = nowMs + b.msUntil(levels[i], 1)
		}
	}
	d.Remaining = -1
	if d.Allowed {
		for i, b := range bs {
			levels[i]--
			b.tokens, b.last = levels[i], now
			l.buckets[label+"\x00"+keys[i]] = b
			f := &d.Families[i]
			f.Remaining = int64(levels[i])
			f.ResetAtMs = nowMs + b.msUntil(levels[i], b.cap)
			if d.Remaining < 0 || f.Remaining < d.Remaining || (f.Remaining == d.Remaining && f.ResetAtMs > d.ResetAtMs) {
				d.Remaining, d.ResetAtMs = f.Remaining, f.ResetAtMs
			}
		}
		return d
	}
	for i, b := range bs {
		f := &d.Families[i]
		if b != nil {
			f.Remaining = int64(levels[i])
			if levels[i] >= 1 {
				f.ResetAtMs = nowMs + b.msUntil(levels[i], b.cap)
			}
		}
		if d.Remaining < 0 || f.Remaining < d.Remaining {
			d.Remaining = f.Remaining
		}
		if (b == nil || levels[i] < 1) && f.ResetAtMs > d.ResetAtMs {
			d.ResetAtMs = f.ResetAtMs
		}
	}
	d.RetryAfterMs = d.ResetAtMs - nowMs
	return d
}

// sweep drops buckets that have refilled completely. Caller holds mu.
func (l *local) sweep(now time.Time) {
	l.sweeps++
	l.nextSweep = now.Add(sweepEvery)
	for k, b := range l.buckets {
		if b.level(now) >= b.cap {
			delete(l.buckets, k)
		}
	}
}
