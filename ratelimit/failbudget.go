package ratelimit

import (
	"math"
	"net/netip"
	"sync"
	"time"
)

// FailBudget counts, in process, the refused credentials of each client
// (a subject: a client address, or the network it is counted as): a token
// bucket per subject that holds burst refusals and refills at rate a
// second. A caller asks Allow before it verifies a credential and, when the
// credential is refused, spends a unit with Fail. Allow spends nothing, so
// good credentials never touch the budget and concurrent requests of a
// subject with good credentials never wait for one another. While a
// subject's bucket holds less than one unit, Allow refuses and says how long
// until it holds one again, and the caller answers without verifying.
//
// Fail spends a unit even when concurrent refusals, verified while the
// bucket still held units, already emptied it: the bucket goes below zero
// and the subject waits that much longer. So a client that sends its bad
// credentials concurrently gets no more verifications over time than one
// that sends them one after another: burst, then rate a second.
//
// Nothing leaves the process (no Redis round trip on the path an attacker
// drives), so each instance keeps its own budget. Memory is bounded: at
// most max subjects have a bucket of their own, and only subjects with a
// refusal do. A bucket that has refilled completely is the same as none: a
// full map is swept of such buckets at most once per sweepEvery (a sweep
// looks at every bucket under the lock every request takes). A subject
// that finds the map still full is not limited: its requests are verified
// as if there were no budget, and its refusals are not kept. A budget
// shared by such subjects would let a client rotating addresses (a /48
// holds 65,536 IPv6 /64s) keep it spent and so refuse every client that
// never failed; past the cap the rotating client gets what it had before
// any budget (a verification a request), and the subjects that hold a
// bucket keep it (none is pushed out to make room).
//
// A FailBudget is safe for concurrent use.
type FailBudget struct {
	burst float64
	rate  float64 // units a second
	max   int
	epoch time.Time // bucket times are nanoseconds since it (monotonic)

	mu        sync.Mutex // guards the fields below
	buckets   map[netip.Prefix]failBucket
	nextSweep time.Time // a full map is not swept before this
}

// failBucket is one subject's budget: tokens (below zero after concurrent
// refusals) at last (ns since epoch).
type failBucket struct {
	tokens float64
	last   int64
}

// NewFailBudget returns a budget of burst refusals per subject, refilled at
// rate a second, with at most max subjects holding a bucket of their own.
// burst, rate and max must be positive.
func NewFailBudget(burst int, rate float64, max int) *FailBudget {
	now := time.Now()
	return &FailBudget{
		burst: float64(burst), rate: rate, max: max, epoch: now,
		buckets: make(map[netip.Prefix]failBucket),
	}
}

// Allow reports whether subject's budget holds a unit at now, spending
// nothing. When it does not, it returns false with the wait until it does
// (at least one millisecond). A subject without a bucket of its own is
// allowed.
func (f *FailBudget) Allow(subject netip.Prefix, now time.Time) (time.Duration, bool) {
	t := f.clock(now)
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.buckets[subject]
	if !ok {
		return 0, true
	}
	if level := f.level(b, t); level < 1 {
		return f.wait(level), false
	}
	return 0, true
}

// Fail spends one unit of subject's budget for a refused credential: from
// its own bucket, made when the map has room (after a sweep, if it is
// full); with the map still full, the refusal is not kept.
func (f *FailBudget) Fail(subject netip.Prefix, now time.Time) {
	t := f.clock(now)
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.buckets[subject]
	if !ok {
		if len(f.buckets) >= f.max && !now.Before(f.nextSweep) {
			f.sweep(now, t)
		}
		if len(f.buckets) >= f.max {
			return
		}
		b = failBucket{tokens: f.burst, last: t}
	}
	f.buckets[subject] = failBucket{tokens: f.level(b, t) - 1, last: t}
}

// clock is now in nanoseconds since the budget's epoch.
func (f *FailBudget) clock(now time.Time) int64 { return int64(now.Sub(f.epoch)) }

// level is b's units at t, refilled and capped at the burst.
func (f *FailBudget) level(b failBucket, t int64) float64 {
	el := max(t-b.last, 0)
	return min(b.tokens+f.rate*float64(el)/float64(time.Second), f.burst)
}

// wait is how long until a bucket at level holds one unit.
func (f *FailBudget) wait(level float64) time.Duration {
	d := time.Duration(math.Ceil((1 - level) / f.rate * float64(time.Second)))
	return max(d, time.Millisecond)
}

// sweep drops buckets that have refilled completely. Caller holds mu.
func (f *FailBudget) sweep(now time.Time, t int64) {
	f.nextSweep = now.Add(sweepEvery)
	for k, b := range f.buckets {
		if f.level(b, t) >= f.burst {
			delete(f.buckets, k)
		}
	}
}

// Len is how many subjects hold a bucket of their own (at most max).
func (f *FailBudget) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.buckets)
}
