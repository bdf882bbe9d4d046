package ratelimit

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

func subject(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
}

// tryFail is a request with a bad credential: verified (and refused) when
// the budget allows it.
func tryFail(f *FailBudget, s netip.Prefix, now time.Time) bool {
	if _, ok := f.Allow(s, now); !ok {
		return false
	}
	f.Fail(s, now)
	return true
}

// A subject spends its burst, is refused until one unit has refilled (the
// wait it is told is exact), and is allowed again then.
func TestFailBudgetRefillsAtItsRate(t *testing.T) {
	f := NewFailBudget(3, 2, 10) // 3 at once, then 2 a second
	t0 := f.epoch.Add(time.Hour)
	for i := range 3 {
		if !tryFail(f, subject(1), t0) {
			t.Fatalf("refusal %d of the burst was not allowed", i)
		}
	}
	wait, ok := f.Allow(subject(1), t0)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("past the burst: ok %v wait %v, want a refusal and 500ms", ok, wait)
	}
	if _, ok := f.Allow(subject(1), t0.Add(wait-time.Millisecond)); ok {
		t.Fatal("allowed before the wait it was told")
	}
	if _, ok := f.Allow(subject(1), t0.Add(wait)); !ok {
		t.Fatal("refused after the wait it was told")
	}
	if _, ok := f.Allow(subject(2), t0); !ok {
		t.Fatal("another subject was refused")
	}
}

// Good credentials spend nothing and leave nothing in the map.
func TestFailBudgetGoodCredentialsSpendNothing(t *testing.T) {
	f := NewFailBudget(2, 0.001, 10)
	t0 := f.epoch.Add(time.Hour)
	for i := range 100 {
		if _, ok := f.Allow(subject(1), t0); !ok {
			t.Fatalf("good credential %d refused", i)
		}
	}
	if n := f.Len(); n != 0 {
		t.Fatalf("%d buckets after good credentials only, want 0", n)
	}
}

// Refusals verified concurrently, all allowed before any was spent, are
// all spent: the subject waits until the budget has refilled what they
// took past it, so over time they cost no more than refusals one after
// another.
func TestFailBudgetConcurrentRefusalsArePaidBack(t *testing.T) {
	const n = 200
	f := NewFailBudget(20, 1, 10)
	t0 := f.epoch.Add(time.Hour)
	var allowed, spent sync.WaitGroup
	allowed.Add(n)
	for range n {
		spent.Go(func() {
			_, ok := f.Allow(subject(1), t0)
			allowed.Done()
			allowed.Wait() // every request is verified before any is refused
			if ok {
				f.Fail(subject(1), t0)
			}
		})
	}
	spent.Wait()
	// 200 units spent from 20: one more unit is there after 181 s.
	wait, ok := f.Allow(subject(1), t0)
	if ok || wait != 181*time.Second {
		t.Fatalf("after %d concurrent refusals: ok %v wait %v, want 181s", n, ok, wait)
	}
	if _, ok := f.Allow(subject(1), t0.Add(wait-time.Millisecond)); ok {
		t.Fatal("allowed before the wait it was told")
	}
	if _, ok := f.Allow(subject(1), t0.Add(wait)); !ok {
		t.Fatal("refused after the wait it was told")
	}
}

// The map holds at most max subjects; the others are not limited, so
// rotating subjects cannot spend a budget others then find empty. Buckets
// that have refilled are swept (at most once a second) and make room again.
func TestFailBudgetIsBounded(t *testing.T) {
	const max = 100
	f := NewFailBudget(2, 1, max)
	t0 := f.epoch.Add(time.Hour)
	verified := 0
	for i := range 100_000 {
		if tryFail(f, subject(i), t0) {
			verified++
		}
	}
	if n := f.Len(); n != max {
		t.Fatalf("%d buckets, want the cap %d", n, max)
	}
	// Past the cap nobody is limited: a client rotating addresses cannot
	// spend a budget that clients which never failed would then find empty.
	if verified != 100_000 {
		t.Fatalf("%d verified, want all 100000 (past the cap a subject is not limited)", verified)
	}
	// The subjects within the cap keep their own budgets: the burst of 2
	// holds one more refusal each, then refuses.
	for i := range max {
		if !tryFail(f, subject(i), t0) || tryFail(f, subject(i), t0) {
			t.Fatalf("subject %d: its own budget of 2 not kept", i)
		}
	}
	t1 := t0.Add(2 * time.Second) // every bucket has refilled
	for i := range 5 {
		if !tryFail(f, subject(1_000_000+i), t1) {
			t.Fatalf("newcomer %d refused after the others refilled", i)
		}
	}
	if n := f.Len(); n != 5 {
		t.Fatalf("%d buckets after the sweep, want the 5 newcomers", n)
	}
}

// A full map of spent buckets is swept at most once a second, not for each
// newcomer (a sweep looks at every bucket under the lock).
func TestFailBudgetSweepsAFullMapAtMostOnceASecond(t *testing.T) {
	f := NewFailBudget(1, 0.001, 10)
	t0 := f.epoch.Add(time.Hour)
	for i := range 10 {
		f.Fail(subject(i), t0)
	}
	sweeps := 0
	for i := range 1000 {
		next := f.nextSweep
		f.Fail(subject(100+i), t0.Add(time.Duration(i)*time.Millisecond))
		if f.nextSweep != next {
			sweeps++
		}
	}
	if sweeps != 1 {
		t.Fatalf("%d sweeps within a second, want 1", sweeps)
	}
}
