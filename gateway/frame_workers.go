package gateway

import (
	"time"

	"github.com/han-app/gateway/internal/workers"
)

// frameWorkers handle client frames (frameAside) on goroutines that wait
// for more instead of exiting (internal/workers). A frame's work (decoding,
// a subscribe's PostgreSQL check, Redis SUBSCRIBE, recovery) needs a deep
// stack; a fresh goroutine per frame grows one from the minimum each time
// (copying it two or three times), which in a connect storm is a
// measurable share of the gateway's CPU. A worker keeps its grown stack
// while frames keep coming and exits after frameWorkerIdle without one, so
// idle connections hold no worker. At most frameWorkersMax run; a frame
// that finds none idle and the pool full gets a short-lived goroutine of
// its own.
type frameWorkers struct {
	pool *workers.Pool[*frameRun]
	exec func(*frameRun) // runFrame; tests give their own
}

const frameWorkersMax = 32

// frameWorkerIdle is how long a worker waits for another frame.
const frameWorkerIdle = 2 * time.Second

func newFrameWorkers() *frameWorkers {
	w := &frameWorkers{exec: runFrame}
	w.pool = workers.New(frameWorkersMax, frameWorkerIdle, func(r *frameRun) { w.exec(r) })
	return w
}

// run hands r to an idle worker, a new worker, or a goroutine of its own.
func (w *frameWorkers) run(r *frameRun) {
	if !w.pool.TryRun(r) {
		go w.exec(r)
	}
}

// stop ends the idle workers and waits for the busy ones to finish their
// frame; later frames get goroutines of their own. Idempotent.
func (w *frameWorkers) stop() { w.pool.Close() }
