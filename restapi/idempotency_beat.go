package restapi

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/han-app/gateway/store"
)

// idemHeartbeat extends the lock every LockTTL/3 until the returned stop
// function is called (which waits for a beat in progress). It gives up when the
// lock is no longer this owner's; the PostgreSQL unique key still prevents
// a second effect.
func (s *Server) idemHeartbeat(k store.IdemKey, owner string) (stop func()) {
	hb := &idemBeat{period: max(s.idem.cfg.LockTTL/3, time.Millisecond)}
	hb.beat = func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), s.idem.cfg.RedisBudget)
		n, err := s.idem.store.Extend(ctx, k, owner)
		cancel()
		if err == nil && n != 1 {
			s.logger.LogAttrs(context.Background(), slog.LevelWarn, "idempotency lock lost while the request ran", slog.String("scope", k.Scope))
			return false
		}
		return true
	}
	hb.mu.Lock()
	hb.due = time.Now().Add(hb.period)
	hb.t = time.AfterFunc(hb.period, hb.fire)
	hb.mu.Unlock()
	return hb.stop
}

// idemBeat is one keyed request's heartbeat: a timer, not a goroutine, so a
// request that ends before the first beat (nearly all) costs no goroutine
// start and no scheduler hand-off.
type idemBeat struct {
	period  time.Duration
	beat    func() bool // extends the lock; false: lost, no further beats
	mu      sync.Mutex
	t       *time.Timer
	due     time.Time // when the current beat was due: the next is one period later, however long a beat took
	stopped bool
	running sync.WaitGroup // a beat in progress
}

func (hb *idemBeat) fire() {
	hb.mu.Lock()
	if hb.stopped {
		hb.mu.Unlock()
		return
	}
	hb.running.Add(1)
	hb.mu.Unlock()
	defer hb.running.Done()
	again := hb.beat()
	hb.mu.Lock()
	if again && !hb.stopped {
		hb.due = hb.due.Add(hb.period)
		hb.t.Reset(max(time.Until(hb.due), 0))
	}
	hb.mu.Unlock()
}

// stop ends the heartbeat and waits for a beat in progress.
func (hb *idemBeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.t.Stop()
	hb.mu.Unlock()
	hb.running.Wait()
}
