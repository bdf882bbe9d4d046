package main

import (
	"runtime/debug"
	"testing"
)

// The target the serving line reports is the one in effect, off included.
func TestGCTargetIsReadAsSet(t *testing.T) {
	before := debug.SetGCPercent(150)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	if got := gcPercent(); got != 150 {
		t.Fatalf("target %d, want 150", got)
	}
	debug.SetGCPercent(-1)
	if got := gcPercent(); got != -1 {
		t.Fatalf("GOGC=off reads %d, want -1", got)
	}
}
