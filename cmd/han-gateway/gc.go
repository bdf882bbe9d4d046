package main

import (
	"runtime/debug"
	"runtime/metrics"
)

// defaultGCPercent is the garbage collector's target when GOGC is not set:
// the heap may grow to three times what is live between collections
// instead of Go's two. A gateway's live heap is small (about 9 KiB per
// connection with its stack), and most of its collection work is scanning
// the stacks of its connections' goroutines, which costs the same however
// much garbage is waiting: collecting half as often halves that work. In a
// connect storm of 10,000 clients the gateway's CPU per connection fell by
// a fifth for about 3 % more heap after a collection (docs/benchmarks.md,
// "Collecting less often"). GOGC in the environment wins; GOMEMLIMIT caps
// the heap whatever the target (docs/runbook.md, "Memory").
const defaultGCPercent = 200

// setDefaultGCPercent applies defaultGCPercent unless GOGC is set (the
// runtime has applied that one already).
func setDefaultGCPercent(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// gcPercent is the collector's target in effect; -1 when it is off.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int(int64(s[0].Value.Uint64()))
}
