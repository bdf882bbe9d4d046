package main

import (
	"testing"
	"time"
)

// Main.Close with Redis (both roles) stalled instead of failing: every
// step is bounded, so Close ends within HAN_DRAIN_DELAY +
// HAN_SHUTDOWN_TIMEOUT and a few seconds, inside a supervisor's stop budget.
func TestCloseIsBoundedWhenRedisStalls(t *testing.T) {
	r, vars := ownRedisEnv(t)
	vars["HAN_SHUTDOWN_TIMEOUT"] = "1s"
	lg := &closeLog{start: time.Now()}
	m := runLogged(t, vars, lg)
	dialogWithSends(t, m, 5, "stall")
	time.Sleep(1500 * time.Millisecond) // settle: relay, presence, purger have run
	thaw := r.Freeze(t)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		t.Logf("Close returned after %v: %v\n%s", time.Since(start).Round(100*time.Millisecond), err, lg.String())
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("Close took %v", d)
		}
	case <-time.After(30 * time.Second):
		thaw()
		<-done
		t.Fatalf("Main.Close with Redis stalled had not returned after 30 s\nlog:\n%s", lg.String())
	}
}
