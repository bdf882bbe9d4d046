package gateway

import (
	"sync"
	"time"
)

// frameWorkers are goroutines that handle client frames (frameAside) and
// wait for more instead of exiting. A frame's work (decoding, a subscribe's
// PostgreSQL check, Redis SUBSCRIBE, recovery) needs a deep stack; a fresh
// goroutine per frame grows one from the minimum each time (copying it two
// or three times), which in a connect storm is a measurable share of the
// gateway's CPU. A worker keeps its grown stack while frames keep coming
// and exits after frameWorkerIdle without one, so idle connections hold no
// worker. At most frameWorkersMax run; a frame that finds none idle and
// the pool full gets a short-lived goroutine of its own, as before.
type frameWorkers struct {
	jobs chan *frameRun // unbuffered: a send succeeds only to a waiting worker
	quit chan struct{}
	exec func(*frameRun) // runFrame; tests give their own

	mu     sync.Mutex // guards n, closed
	n      int
	closed bool
	wg     sync.WaitGroup
}

const (
	frameWorkersMax = 32
)

// frameWorkerIdle is how long a worker waits for another frame (a
// variable for tests).
var frameWorkerIdle = 2 * time.Second

func newFrameWorkers() *frameWorkers {
	return &frameWorkers{jobs: make(chan *frameRun), quit: make(chan struct{}), exec: runFrame}
}

// run hands r to an idle worker, a new worker, or a goroutine of its own.
func (w *frameWorkers) run(r *frameRun) {
	select {
	case w.jobs <- r:
		return
	default:
	}
	w.mu.Lock()
	if w.closed || w.n >= frameWorkersMax {
		w.mu.Unlock()
		go w.exec(r)
		return
	}
	w.n++
	w.wg.Add(1)
	w.mu.Unlock()
	go w.loop(r)
}

// loop runs first, then every frame handed to it until it has been idle
// for frameWorkerIdle or the pool stops.
func (w *frameWorkers) loop(first *frameRun) {
	defer w.wg.Done()
	w.exec(first)
	idle := time.NewTimer(frameWorkerIdle)
	defer idle.Stop()
	for {
		select {
		case r := <-w.jobs:
			w.exec(r)
			idle.Reset(frameWorkerIdle)
		case <-idle.C:
			w.mu.Lock()
			w.n--
			w.mu.Unlock()
			return
		case <-w.quit:
			return
		}
	}
}

// stop ends the idle workers and waits for the busy ones to finish their
// frame; later frames get goroutines of their own. Idempotent.
func (w *frameWorkers) stop() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
