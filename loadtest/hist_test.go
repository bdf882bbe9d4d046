package loadtest_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/han-app/gateway/loadtest"
)

// exactPercentile is the nearest-rank percentile of sorted values.
func exactPercentile(sorted []int64, p float64) int64 {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(rank, 1)
	return sorted[rank-1]
}

func TestHistogramPercentilesMatchExactOnKnownData(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gen := func(n int, f func() int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = f()
		}
		return out
	}
	seq := func(from, to int64) []int64 {
		var out []int64
		for v := from; v <= to; v++ {
			out = append(out, v)
		}
		return out
	}
	cases := []struct {
		name string
		data []int64
	}{
		{"1..100000", seq(1, 100000)},
		{"small exact values", gen(5000, func() int64 { return rng.Int64N(256) })},
		// Latencies: log-normal around 2 ms with a long tail, in ns.
		{"lognormal latencies", gen(200000, func() int64 { return int64(math.Exp(rng.NormFloat64()*1.2 + math.Log(2e6))) })},
		{"exponential", gen(100000, func() int64 { return int64(rng.ExpFloat64() * 5e7) })},
		{"bimodal", gen(50000, func() int64 {
			if rng.IntN(100) < 97 {
				return 1e6 + rng.Int64N(1e5)
			}
			return 2e9 + rng.Int64N(1e9)
		})},
		{"single value", []int64{123456789}},
		{"huge values", gen(1000, func() int64 { return math.MaxInt64 - rng.Int64N(1<<40) })},
	}
	percentiles := []float64{0.1, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := loadtest.NewHistogram()
			var sum int64
			for _, v := range tc.data {
				h.Record(v)
				sum += v
			}
			sorted := slices.Clone(tc.data)
			slices.Sort(sorted)
			if got := h.Count(); got != uint64(len(sorted)) {
				t.Fatalf("count = %d, want %d", got, len(sorted))
			}
			if h.Min() != sorted[0] || h.Max() != sorted[len(sorted)-1] {
				t.Fatalf("min/max = %d/%d, want %d/%d", h.Min(), h.Max(), sorted[0], sorted[len(sorted)-1])
			}
			if tc.name != "huge values" && h.Sum() != sum {
				t.Fatalf("sum = %d, want %d", h.Sum(), sum)
			}
			for _, p := range percentiles {
				want := exactPercentile(sorted, p)
				got := h.Percentile(p)
				relErr := math.Abs(float64(got)-float64(want)) / math.Max(float64(want), 1)
				if relErr > loadtest.MaxRelativeError {
					t.Errorf("p%v = %d, exact %d: relative error %.5f > %.5f", p, got, want, relErr, loadtest.MaxRelativeError)
				}
				if want < 256 && got != want {
					t.Errorf("p%v = %d, want exactly %d below 256", p, got, want)
				}
			}
		})
	}
}

func TestHistogramEmptyAndNegative(t *testing.T) {
	h := loadtest.NewHistogram()
	if h.Percentile(99) != 0 || h.Max() != 0 || h.Min() != 0 || h.Mean() != 0 {
		t.Fatal("an empty histogram must report zeros")
	}
	h.Record(-5)
	if h.Min() != 0 || h.Percentile(50) != 0 {
		t.Fatalf("a negative value must count as 0, min=%d", h.Min())
	}
}

func TestHistogramConcurrentRecordAndMerge(t *testing.T) {
	a, b := loadtest.NewHistogram(), loadtest.NewHistogram()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10000 {
				v := int64(g*10000 + i + 1)
				if g%2 == 0 {
					a.Record(v)
				} else {
					b.Record(v)
				}
			}
		})
	}
	wg.Wait()
	a.Merge(b)
	if a.Count() != 80000 || a.Min() != 1 || a.Max() != 80000 {
		t.Fatalf("merged count/min/max = %d/%d/%d", a.Count(), a.Min(), a.Max())
	}
	if want := int64(80000 * 80001 / 2); a.Sum() != want {
		t.Fatalf("sum = %d, want %d", a.Sum(), want)
	}
	for _, p := range []float64{50, 99} {
		want := float64(int64(math.Ceil(p / 100 * 80000)))
		if got := float64(a.Percentile(p)); math.Abs(got-want)/want > loadtest.MaxRelativeError {
			t.Errorf("p%v = %v, want ≈ %v", p, got, want)
		}
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := loadtest.NewHistogram()
	b.RunParallel(func(pb *testing.PB) {
		v := int64(1e6)
		for pb.Next() {
			h.Record(v)
			v = v*7%1e9 + 1
		}
	})
}
