package gateway

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Frames handed one after another reuse one worker (its grown stack), a
// burst beyond the pool still gets every frame handled, idle workers go
// away, and stop waits for the busy ones.
func TestFrameWorkersReuseOverflowAndExit(t *testing.T) {
	old := frameWorkerIdle
	frameWorkerIdle = 100 * time.Millisecond
	t.Cleanup(func() { frameWorkerIdle = old })
	w := newFrameWorkers()
	var handled atomic.Int64
	gids := sync.Map{}
	release := make(chan struct{})
	w.exec = func(r *frameRun) {
		gids.Store(goroutineID(), true)
		if r.rd != nil { // a blocking frame of the burst
			<-release
		}
		handled.Add(1)
		r.done <- true
	}
	run := func(block bool) *frameRun {
		r := &frameRun{done: make(chan bool, 1)}
		if block {
			r.rd = blockingReader{}
		}
		w.run(r)
		return r
	}
	// Sequential frames (a reader reads the next frame's header between
	// them): a worker handles them all.
	for range 50 {
		if !<-run(false).done {
			t.Fatal("frame not answered")
		}
		time.Sleep(time.Millisecond)
	}
	n := 0
	gids.Range(func(any, any) bool { n++; return true })
	if n > 2 {
		t.Fatalf("50 sequential frames ran on %d goroutines, want them on a reused worker", n)
	}
	// A burst of blocking frames: the pool fills, the rest overflow; all end.
	burst := make([]*frameRun, frameWorkersMax+20)
	for i := range burst {
		burst[i] = run(true)
	}
	w.mu.Lock()
	if w.n != frameWorkersMax {
		t.Errorf("workers during the burst = %d, want %d", w.n, frameWorkersMax)
	}
	w.mu.Unlock()
	close(release)
	for _, r := range burst {
		<-r.done
	}
	if got := handled.Load(); got != int64(50+len(burst)) {
		t.Fatalf("handled %d frames, want %d", got, 50+len(burst))
	}
	// Idle workers exit on their own.
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		live := w.n
		w.mu.Unlock()
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still running after being idle", live)
		}
		time.Sleep(20 * time.Millisecond)
	}
	run(false)
	w.stop()
	w.stop()
	// After stop a frame still gets handled, on a goroutine of its own.
	if !<-run(false).done {
		t.Fatal("frame after stop not answered")
	}
}

type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { return 0, nil }

func goroutineID() string {
	b := make([]byte, 32)
	b = b[:runtime.Stack(b, false)]
	for i := len("goroutine "); i < len(b); i++ {
		if b[i] == ' ' {
			return string(b[len("goroutine "):i])
		}
	}
	return ""
}
