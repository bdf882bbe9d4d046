package pubsub

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/han-app/gateway/store/rds"
)

// The canary: each instance publishes to a channel of its own every
// CanaryInterval and reads it back on its Pub/Sub link, which measures the
// link's lag end to end; a watchdog ends a session whose link went quiet.

// goAll runs each of fns on a goroutine of its own, counted by bg.
func goAll(bg *sync.WaitGroup, fns ...func()) {
	for _, fn := range fns {
		bg.Go(fn)
	}
}

// watch calls onDead once dead reports true (checked every half canary
// interval) and returns; or returns when ctx ends. It is what ends a
// session whose link went quiet: the session reads without a deadline.
func (s *Subscriber) watch(ctx context.Context, dead func() bool, onDead func()) {
	t := time.NewTicker(max(s.cfg.CanaryInterval/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if dead() {
			onDead()
			return
		}
	}
}

func (s *Subscriber) canaryLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.CanaryInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.CanaryInterval)
		_ = rds.Publish(pctx, s.rdb, s.cfg.Mode, s.canary, []byte(strconv.FormatInt(time.Now().UnixNano(), 10))).Err()
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Subscriber) canaryReceived(payload string) {
	now := time.Now()
	s.lastCanary.Store(now.UnixNano())
	if sent, err := strconv.ParseInt(payload, 10, 64); err == nil {
		lag := max(now.Sub(time.Unix(0, sent)), 0)
		s.canaryLagNs.Store(int64(lag))
		s.metrics.lag.Set(lag.Seconds())
	}
}
