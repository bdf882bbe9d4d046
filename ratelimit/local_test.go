package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestLocalLimiterIsAFractionOfTheLimit(t *testing.T) {
	l := newLocal(0.25, 100)
	rule := Rule{Family: FamilyUser, Limit: 8, Window: time.Minute}
	t0 := time.UnixMilli(1_000_000)
	for i := range 2 {
		if d := l.decide("GET /x", []string{"u"}, []Rule{rule}, t0); !d.Allowed || d.Families[0].Rule.Limit != 2 {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := l.decide("GET /x", []string{"u"}, []Rule{rule}, t0)
	if d.Allowed || d.ResetAtMs != t0.UnixMilli()+30_000 {
		t.Fatalf("third request: %+v (one token refills in 30 s)", d)
	}
	if d := l.decide("GET /x", []string{"u"}, []Rule{rule}, time.UnixMilli(d.ResetAtMs-1)); d.Allowed {
		t.Fatal("admitted before reset_at")
	}
	if d := l.decide("GET /x", []string{"u"}, []Rule{rule}, time.UnixMilli(d.ResetAtMs)); !d.Allowed {
		t.Fatal("denied at reset_at")
	}
	if d := l.decide("GET /x", []string{"other-user"}, []Rule{{Family: FamilyUser, Limit: 1, Window: time.Second}}, t0); !d.Allowed || d.Families[0].Rule.Limit != 1 {
		t.Fatalf("a limit below 1/fraction still grants one request: %+v", d)
	}
}

func TestLocalLimiterIsAllOrNothing(t *testing.T) {
	l := newLocal(1, 100)
	rules := []Rule{{Family: FamilyUser, Limit: 5, Window: time.Minute}, {Family: FamilyDialog, Limit: 1, Window: time.Minute}}
	t0 := time.UnixMilli(1_000_000)
	if d := l.decide("POST /s", []string{"alice", "d"}, rules, t0); !d.Allowed {
		t.Fatal("first send denied")
	}
	if d := l.decide("POST /s", []string{"bob", "d"}, rules, t0); d.Allowed {
		t.Fatal("dialog limit not applied")
	}
	if d := l.decide("POST /s", []string{"bob", "d2"}, rules, t0); !d.Allowed || d.Families[0].Remaining != 4 {
		t.Fatalf("bob was debited by the denied send: %+v", d)
	}
}

func TestLocalLimiterIsBounded(t *testing.T) {
	l := newLocal(1, 3)
	rule := []Rule{{Family: FamilyIP, Limit: 2, Window: time.Second}}
	t0 := time.UnixMilli(1_000_000)
	for _, k := range []string{"a", "b", "c"} {
		if d := l.decide("GET /x", []string{k}, rule, t0); !d.Allowed {
			t.Fatalf("%s denied", k)
		}
	}
	if d := l.decide("GET /x", []string{"d"}, rule, t0); d.Allowed {
		t.Fatal("a fourth identity was admitted past the cap while the others are active")
	}
	if n := l.size(); n != 3 {
		t.Fatalf("%d buckets, cap 3", n)
	}
	// Once the others have refilled they are dropped to make room.
	if d := l.decide("GET /x", []string{"d"}, rule, t0.Add(time.Second)); !d.Allowed {
		t.Fatal("no room made after the buckets refilled")
	}
	if n := l.size(); n != 1 {
		t.Fatalf("%d buckets after the sweep, want 1", n)
	}
}

// While Redis is down, a client that rotates identities (a host with a /48
// has 65,536 IPv6 /64s) keeps the fallback's map full of active buckets,
// and each of its newcomers is denied. Finding that out must not cost a
// pass over every bucket each time, under the lock every fallback decision
// of the instance takes: a full map is swept at most once a second, the
// time the denial tells the newcomer to wait.
func TestNewcomersToAFullLocalLimiterDoNotSweepItEachTime(t *testing.T) {
	const entries = 1000
	l := newLocal(1, entries)
	rule := []Rule{{Family: FamilyIP, Limit: 2, Window: time.Minute}}
	t0 := time.UnixMilli(1_000_000)
	for i := range entries {
		if d := l.decide("GET /x", []string{fmt.Sprint("active-", i)}, rule, t0); !d.Allowed {
			t.Fatalf("identity %d of %d denied", i, entries)
		}
	}
	for i := range entries {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		d := l.decide("GET /x", []string{fmt.Sprint("newcomer-", i)}, rule, now)
		if d.Allowed || d.RetryAfterMs != 1000 {
			t.Fatalf("newcomer %d to a full map of active buckets: %+v, want denied for a second", i, d)
		}
	}
	l.mu.Lock()
	sweeps := l.sweeps
	l.mu.Unlock()
	if sweeps > 1 {
		t.Fatalf("%d newcomers within a second swept the full map %d times, want once", entries, sweeps)
	}
}

// size is the number of buckets held, for the sweep assertions.
func (l *local) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// A policy change reaches the fallback too: an identity the in-process
// limiter already holds a bucket for gets the share of the new limit at
// once (a lowered limit is not kept at its old, larger share while Redis is
// down), and the quota it is told is the one enforced.
func TestLocalLimiterFollowsALimitChange(t *testing.T) {
	l := newLocal(0.25, 100)
	t0 := time.UnixMilli(1_000_000)
	old := []Rule{{Family: FamilyUser, Limit: 40, Window: time.Minute}} // local share 10
	if d := l.decide("GET /x", []string{"u"}, old, t0); !d.Allowed || d.Families[0].Remaining != 9 {
		t.Fatalf("first request: %+v", d)
	}
	lowered := []Rule{{Family: FamilyUser, Limit: 4, Window: time.Minute}} // local share 1
	admitted := 0
	var denial Decision
	for range 10 {
		d := l.decide("GET /x", []string{"u"}, lowered, t0)
		if d.Families[0].Rule.Limit != 1 {
			t.Fatalf("quota told %d, want the new share 1", d.Families[0].Rule.Limit)
		}
		if d.Allowed {
			admitted++
		} else if denial.NowMs == 0 {
			denial = d
		}
	}
	if admitted != 1 {
		t.Fatalf("after the limit was lowered to a share of 1, %d requests were admitted", admitted)
	}
	if denial.ResetAtMs != t0.UnixMilli()+60_000 {
		t.Fatalf("denial reset_at %d, want one token of a 1-per-minute bucket: %d", denial.ResetAtMs, t0.UnixMilli()+60_000)
	}
	raised := []Rule{{Family: FamilyUser, Limit: 400, Window: time.Minute}} // local share 100
	if d := l.decide("GET /x", []string{"u"}, raised, t0.Add(6*time.Second)); !d.Allowed || d.Families[0].Remaining != 9 {
		t.Fatalf("6 s after the limit was raised to a share of 100 (10 tokens refilled): %+v", d)
	}
}
