package presence

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// A background loop with a huge interval runs rarely, never back to back:
// its jittered sleep (0.9 × interval plus up to 0.2 × interval) was
// computed as interval × 9 / 10, which wraps negative from about 284,700 h
// on, and the loop then ran against Redis as fast as it could. The longest
// sleep (maxSleep, hence MaxLivenessGap) did the same: it is at least
// 0.9 × the interval.
func TestHugeLoopIntervalsDoNotSpin(t *testing.T) {
	for _, interval := range []time.Duration{300000 * time.Hour, 1<<63 - 1} {
		if longest := maxSleep(interval); longest < interval-interval/10 {
			t.Errorf("interval %v: longest sleep %v", interval, longest)
		}
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			runs := 0
			done := make(chan struct{})
			go func() {
				defer close(done)
				(&Presence{}).every(ctx, interval, func(context.Context) {
					if runs++; runs > 10 {
						cancel() // spinning: stop the loop so the test can fail
					}
				})
			}()
			time.Sleep(24 * time.Hour)
			cancel()
			<-done
			if runs != 1 {
				t.Errorf("interval %v: the loop ran %d times in a day, want once", interval, runs)
			}
		})
	}
	if got, want := MaxLivenessGap(10*time.Second), 3*time.Second+(10*time.Second/3)/5; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Errorf("MaxLivenessGap(10s) = %v, want about %v", got, want)
	}
}
