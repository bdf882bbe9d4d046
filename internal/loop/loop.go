package loop

import (
	"context"
	"sync"
	"time"
)

// Config tunes a Loop.
type Config struct {
	// Interval between the starts of two runs. Must be positive.
	Interval time.Duration
	// Immediate makes the first run start at Start instead of one Interval
	// later.
	Immediate bool
	// Timeout bounds each run's context; zero means only Close cancels it.
	Timeout time.Duration
}

// Loop is one background goroutine running a function every Interval.
type Loop struct {
	cfg Config
	run func(ctx context.Context) bool

	// ctx is cancelled by Close: it ends the wait between runs and the
	// context of the run in progress.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards running, again, closed
	running bool
	again   bool // a Start arrived since the current run began
	closed  bool
}

// New builds a stopped loop calling run every cfg.Interval while run returns
// true.
func New(cfg Config, run func(ctx context.Context) bool) *Loop {
	ctx, cancel := context.WithCancel(context.Background())
	return &Loop{cfg: cfg, run: run, ctx: ctx, cancel: cancel}
}

// Start launches the goroutine unless it is running or the loop is closed.
func (l *Loop) Start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.again = true
	if l.running {
		return
	}
	l.running = true
	l.wg.Add(1)
	go l.loop()
}

// Close stops the loop and waits for a run in progress to end.
func (l *Loop) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// Stopped is closed when Close is called, for waits inside a run that must
// also end when the loop stops.
func (l *Loop) Stopped() <-chan struct{} { return l.ctx.Done() }

func (l *Loop) loop() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	wait := !l.cfg.Immediate
	for {
		if wait && !l.tick(t) {
			return
		}
		wait = true
		l.mu.Lock()
		l.again = false
		l.mu.Unlock()
		if l.once() {
			continue
		}
		l.mu.Lock()
		if !l.again || l.closed {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.again = false
		l.mu.Unlock()
		wait = !l.cfg.Immediate
	}
}

// tick waits for the next tick; false when Close came first. A tick that
// is ready together with Close loses: select picks at random, so the
// context is checked again after a tick, and no run starts after Close.
func (l *Loop) tick(t *time.Ticker) bool {
	select {
	case <-l.ctx.Done():
	case <-t.C:
		if l.ctx.Err() == nil {
			return true
		}
	}
	l.mu.Lock()
	l.running = false
	l.mu.Unlock()
	return false
}

func (l *Loop) once() bool {
	ctx, cancel := l.ctx, context.CancelFunc(func() {})
	if l.cfg.Timeout > 0 {
		ctx, cancel = context.WithTimeout(l.ctx, l.cfg.Timeout)
	}
	defer cancel()
	return l.run(ctx)
}
