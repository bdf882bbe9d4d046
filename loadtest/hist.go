package loadtest

import (
	"math"
	"math/bits"
	"sync/atomic"
)

// Histogram geometry: every power of two above histExact is split into
// histSub equal sub-buckets (HDR histogram style), so a bucket's width is at
// most 1/histSub of its lower bound. Reporting a bucket by its midpoint
// bounds the relative error of any percentile by 1/(2·histSub) = 0.39 %.
// Values below histExact (2·histSub) each get a bucket of their own and are
// exact.
const (
	histSubBits = 7
	histSub     = 1 << histSubBits // sub-buckets per power of two
	histExact   = 2 * histSub      // values below are recorded exactly
	// A non-negative int64 has at most 63 significant bits, so the largest
	// shift is 63-histSubBits-1 and the largest index is below this.
	histBuckets = (63-histSubBits)*histSub + histExact
)

// MaxRelativeError is the largest relative difference between a value a
// Histogram reports for a percentile and the exact nearest-rank percentile
// of the recorded values.
const MaxRelativeError = 1.0 / (2 * histSub)

// Histogram records non-negative int64 values (nanoseconds for latencies)
// into logarithmic buckets with bounded relative error, in constant memory
// (≈ 58 KiB) whatever the number of values. Record is lock-free and safe
// for concurrent use; readers see a consistent-enough view while writers
// run and an exact one after they stop.
type Histogram struct {
	counts [histBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Int64
	min    atomic.Int64 // math.MaxInt64 while empty
	max    atomic.Int64 // exact maximum; -1 while empty
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	h := &Histogram{}
	h.min.Store(math.MaxInt64)
	h.max.Store(-1)
	return h
}

// histIndex maps v ≥ 0 to its bucket: v itself below histExact, then
// shift·histSub + (v >> shift) where shift keeps histSubBits+1 significant
// bits of v.
func histIndex(v int64) int {
	if v < histExact {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - histSubBits - 1
	return shift*histSub + int(v>>shift)
}

// histBounds is the inclusive value range of bucket i.
func histBounds(i int) (lo, hi int64) {
	if i < histExact {
		return int64(i), int64(i)
	}
	shift := i/histSub - 1
	top := int64(i - shift*histSub)
	lo = top << shift
	return lo, lo + (int64(1) << shift) - 1
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for cur := h.min.Load(); v < cur && !h.min.CompareAndSwap(cur, v); cur = h.min.Load() {
	}
	for cur := h.max.Load(); v > cur && !h.max.CompareAndSwap(cur, v); cur = h.max.Load() {
	}
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Sum is the exact sum of the recorded values.
func (h *Histogram) Sum() int64 { return h.sum.Load() }

// Min is the exact smallest value, 0 when empty.
func (h *Histogram) Min() int64 {
	if h.n.Load() == 0 {
		return 0
	}
	return h.min.Load()
}

// Max is the exact largest value, 0 when empty.
func (h *Histogram) Max() int64 {
	if h.n.Load() == 0 {
		return 0
	}
	return h.max.Load()
}

// Mean is the exact arithmetic mean, 0 when empty.
func (h *Histogram) Mean() float64 {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return float64(h.sum.Load()) / float64(n)
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100): the
// smallest recorded value v such that at least p % of the values are ≤ v,
// within MaxRelativeError. p ≤ 0 gives Min, p ≥ 100 gives the exact Max.
// It returns 0 when the histogram is empty.
func (h *Histogram) Percentile(p float64) int64 {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return h.Min()
	}
	if p >= 100 {
		return h.Max()
	}
	return h.atRank(max(uint64(math.Ceil(p/100*float64(n))), 1))
}

// atRank is the rank-th smallest recorded value (1-based), within
// MaxRelativeError; the exact Max when rank is past the last value.
func (h *Histogram) atRank(rank uint64) int64 {
	var seen uint64
	for i := range h.counts {
		c := h.counts[i].Load()
		if c == 0 {
			continue
		}
		seen += c
		if seen >= rank {
			lo, hi := histBounds(i)
			v := lo + (hi-lo)/2
			// The exact extremes are known; never report past them.
			return min(max(v, h.Min()), h.Max())
		}
	}
	return h.Max()
}

// Merge adds every value recorded in o to h. o must not be written
// concurrently.
func (h *Histogram) Merge(o *Histogram) {
	if o.n.Load() == 0 {
		return
	}
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.n.Add(o.n.Load())
	h.sum.Add(o.sum.Load())
	for v, cur := o.min.Load(), h.min.Load(); v < cur && !h.min.CompareAndSwap(cur, v); cur = h.min.Load() {
	}
	for v, cur := o.max.Load(), h.max.Load(); v > cur && !h.max.CompareAndSwap(cur, v); cur = h.max.Load() {
	}
}
