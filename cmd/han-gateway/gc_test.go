package main

import (
	"runtime/debug"
	"testing"
)

// An operator's GOGC wins over the gateway's default; without one the
// default is in effect and reported as such.
func TestGCTargetIsTheDefaultUnlessGOGCIsSet(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	debug.SetGCPercent(50) // as the runtime would have applied GOGC=50
	setDefaultGCPercent(func(k string) string {
		if k == "GOGC" {
			return "50"
		}
		return ""
	})
	if got := gcPercent(); got != 50 {
		t.Fatalf("with GOGC=50 the target is %d, want 50", got)
	}

	setDefaultGCPercent(func(string) string { return "" })
	if got := gcPercent(); got != defaultGCPercent {
		t.Fatalf("without GOGC the target is %d, want %d", got, defaultGCPercent)
	}

	debug.SetGCPercent(-1)
	if got := gcPercent(); got != -1 {
		t.Fatalf("GOGC=off reads %d, want -1", got)
	}
}
