package main

import "runtime/metrics"

// gcPercent is the garbage collector's target in effect (GOGC, else Go's
// 100); -1 when it is off. The "serving" log line prints it: raising it
// trades heap for CPU (docs/runbook.md, "Memory").
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int(int64(s[0].Value.Uint64()))
}
