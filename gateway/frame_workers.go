package gateway

import (
	"sync"
	"time"
)

// workers are goroutines that run jobs and wait for more instead of
// exiting, so a job that needs a deep stack finds one already grown and a
// burst of short jobs does not start and end a goroutine per job. Two
// pools use them: client frames (frameAside: decoding, a subscribe's
// PostgreSQL check, Redis SUBSCRIBE, recovery), where a fresh goroutine
// per frame grew its stack from the minimum each time, a measurable share
// of the gateway's CPU in a connect storm; and socket writers (conn.signal),
// where fan-out started and ended a goroutine per delivery. A worker exits
// after workerIdle without a job, so idle connections hold none. At most
// max run; a job that finds none idle and the pool full gets a short-lived
// goroutine of its own.
type workers[T any] struct {
	jobs chan T // unbuffered: a send succeeds only to a waiting worker
	quit chan struct{}
	exec func(T)
	max  int

	mu     sync.Mutex // guards n, closed
	n      int
	closed bool
	wg     sync.WaitGroup
}

// frameWorkers handle client frames (runFrame).
type frameWorkers = workers[*frameRun]

const (
	frameWorkersMax  = 32
	writerWorkersMax = 64
)

// workerIdle is how long a worker waits for another job (a variable for
// tests).
var workerIdle = 2 * time.Second

func newWorkers[T any](exec func(T), max int) *workers[T] {
	return &workers[T]{jobs: make(chan T), quit: make(chan struct{}), exec: exec, max: max}
}

func newFrameWorkers() *frameWorkers { return newWorkers(runFrame, frameWorkersMax) }

// newWriterWorkers run connections' write loops (conn.signal).
func newWriterWorkers() *workers[*conn] {
	return newWorkers(func(c *conn) { c.writeLoop() }, writerWorkersMax)
}

// run hands job to an idle worker, a new worker, or a goroutine of its
// own. It never blocks.
func (w *workers[T]) run(job T) {
	select {
	case w.jobs <- job:
		return
	default:
	}
	w.mu.Lock()
	if w.closed || w.n >= w.max {
		w.mu.Unlock()
		go w.exec(job)
		return
	}
	w.n++
	w.wg.Add(1)
	w.mu.Unlock()
	go w.loop(job)
}

// loop runs first, then every job handed to it until it has been idle for
// workerIdle or the pool stops.
func (w *workers[T]) loop(first T) {
	defer w.wg.Done()
	w.exec(first)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case job := <-w.jobs:
			w.exec(job)
			idle.Reset(workerIdle)
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
// job; later jobs get goroutines of their own. Idempotent.
func (w *workers[T]) stop() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
