package workers

import (
	"sync"
	"time"
)

// Pool runs jobs on at most Max workers. A job is handed only to a worker
// waiting for one, or to a new worker while fewer than the maximum run;
// otherwise TryRun refuses it and the caller runs it some other way (on a
// goroutine of its own, or inline), so a job never waits behind another.
// Safe for concurrent use.
type Pool[T any] struct {
	jobs chan T // unbuffered: a send succeeds only to a waiting worker
	quit chan struct{}
	exec func(T)
	max  int
	idle time.Duration

	mu     sync.Mutex // guards n, closed
	n      int
	closed bool
	wg     sync.WaitGroup
}

// New returns an empty pool (no worker runs until the first job) of at most
// max workers, each running exec for its jobs. A worker that waits idle
// longer than idle exits; idle 0 keeps workers until Close.
func New[T any](max int, idle time.Duration, exec func(T)) *Pool[T] {
	return &Pool[T]{jobs: make(chan T), quit: make(chan struct{}), exec: exec, max: max, idle: idle}
}

// TryRun hands job to an idle worker or to a new one, and reports false,
// having run nothing, when every worker is busy and the pool is full, or
// the pool is closed.
func (p *Pool[T]) TryRun(job T) bool {
	select {
	case p.jobs <- job:
		return true
	default:
	}
	p.mu.Lock()
	if p.closed || p.n >= p.max {
		p.mu.Unlock()
		return false
	}
	p.n++
	p.wg.Add(1)
	p.mu.Unlock()
	go p.loop(job)
	return true
}

// Workers is how many workers run now.
func (p *Pool[T]) Workers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// loop runs first, then every job handed to it until it has been idle for
// p.idle or the pool closes.
func (p *Pool[T]) loop(first T) {
	defer p.wg.Done()
	p.exec(first)
	var idle <-chan time.Time
	var t *time.Timer
	if p.idle > 0 {
		t = time.NewTimer(p.idle)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case job := <-p.jobs:
			p.exec(job)
			if t != nil {
				t.Reset(p.idle)
			}
		case <-idle:
			p.mu.Lock()
			p.n--
			p.mu.Unlock()
			return
		case <-p.quit:
			p.mu.Lock()
			p.n--
			p.mu.Unlock()
			return
		}
	}
}

// Close ends the idle workers and waits until the busy ones have finished
// their job; TryRun refuses every job from then on. Idempotent.
func (p *Pool[T]) Close() {
	p.Stop()
	p.wg.Wait()
}

// Stop is Close without the wait: the idle workers end now, the busy ones
// once their job is done. Idempotent.
func (p *Pool[T]) Stop() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
}
