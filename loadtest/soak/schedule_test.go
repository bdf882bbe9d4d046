package soak_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest/soak"
)

// The same seed replays the same schedule; the CI soak's 3 minutes hold
// every kind of fault, each lifted before the run's tail.
func TestScheduleReplaysFromSeed(t *testing.T) {
	a, b := soak.Schedule(1, 3*time.Minute), soak.Schedule(1, 3*time.Minute)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different schedules:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, soak.Schedule(2, 3*time.Minute)) {
		t.Fatal("seeds 1 and 2 gave the same schedule")
	}
	kinds := map[string]bool{}
	for i, f := range a {
		kinds[f.Kind] = true
		if f.At+f.Hold > 3*time.Minute-10*time.Second {
			t.Errorf("fault %d (%s) ends at %s, inside the tail", i, f.Kind, f.At+f.Hold)
		}
		if i > 0 && f.At <= a[i-1].At+a[i-1].Hold {
			t.Errorf("fault %d overlaps the one before", i)
		}
	}
	for _, k := range soak.FaultKinds {
		if !kinds[k] {
			t.Errorf("3-minute schedule lacks %s: %v", k, a)
		}
	}
}
