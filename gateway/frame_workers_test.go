package gateway

import (
	"testing"
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
	}
	if w.pool.Workers() != 1 {
		t.Fatalf("%d workers after three frames one after another, want 1", w.pool.Workers())
	}
	w.stop()
	w.stop()
	if !<-run().done {
		t.Fatal("frame after stop not answered")
	}
}
