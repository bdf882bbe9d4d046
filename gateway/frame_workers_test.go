package gateway

import (
	"testing"
	"time"
)

// Every frame is handled: by a worker, and after stop on a goroutine of
// its own (the pool's reuse, limit and idle exit are internal/workers').
func TestFrameWorkersHandleFramesBeforeAndAfterStop(t *testing.T) {
	w := newFrameWorkers()
	w.exec = func(r *frameRun) { r.done <- true }
	run := func() *frameRun {
		r := &frameRun{done: make(chan bool, 1)}
		w.run(r)
		return r
	}
	for range 3 {
		if !<-run().done {
			t.Fatal("frame not answered")
		}
		time.Sleep(time.Millisecond) // the worker is back waiting
	}
	if n := w.pool.Workers(); n < 1 || n > 2 {
		t.Fatalf("%d workers after three frames one after another, want them on a reused worker", n)
	}
	w.stop()
	w.stop()
	if !<-run().done {
		t.Fatal("frame after stop not answered")
	}
}
