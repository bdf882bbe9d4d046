package loop_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// wait fails the test unless ch delivers within a generous deadline.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestLoopRunsRepeatedlyUntilCloseCancelsTheRunInProgress(t *testing.T) {
	runs := make(chan struct{}, 16)
	ended := make(chan error, 1)
	var n atomic.Int32
	l := loop.New(loop.Config{Interval: time.Millisecond, Immediate: true}, func(ctx context.Context) bool {
		if n.Add(1) == 3 {
			<-ctx.Done()
			ended <- ctx.Err()
			return true
		}
		runs <- struct{}{}
		return true
	})
	l.Start()
	wait(t, runs, "first run")
	wait(t, runs, "second run")
	for n.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	l.Close()
	select {
	case err := <-ended:
		if err != context.Canceled {
			t.Fatalf("run context ended with %v, want context.Canceled", err)
		}
	default:
		t.Fatal("Close returned before the run in progress ended")
	}
	select {
	case <-l.Stopped():
	default:
		t.Fatal("Stopped is not closed after Close")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("%d runs, want no run after Close (3)", got)
	}
}

func TestLoopWithoutImmediateWaitsOneInterval(t *testing.T) {
	var n atomic.Int32
	l := loop.New(loop.Config{Interval: time.Hour}, func(context.Context) bool { n.Add(1); return true })
	l.Start()
	l.Close()
	if got := n.Load(); got != 0 {
		t.Fatalf("%d runs before the first interval, want 0", got)
	}
}

func TestLoopStartAfterCloseAndCloseBeforeStartAreNoOps(t *testing.T) {
	var n atomic.Int32
	l := loop.New(loop.Config{Interval: time.Millisecond, Immediate: true}, func(context.Context) bool { n.Add(1); return true })
	l.Close()
	l.Start()
	l.Close()
	if got := n.Load(); got != 0 {
		t.Fatalf("%d runs of a closed loop, want 0", got)
	}
}

func TestLoopEndsWhenRunSaysStopAndStartsAgain(t *testing.T) {
	runs := make(chan int32, 16)
	var n atomic.Int32
	l := loop.New(loop.Config{Interval: time.Millisecond, Immediate: true}, func(context.Context) bool {
		runs <- n.Add(1)
		return false
	})
	defer l.Close()
	l.Start()
	wait(t, runs, "first run")
	l.Start()
	if got := wait(t, runs, "run after the second Start"); got != 2 {
		t.Fatalf("run %d, want 2", got)
	}
}

// A Start that arrives while the last run is deciding to stop must not be
// lost: the Redis prober relies on it when Redis goes down again right
// after a successful probe.
func TestLoopStartDuringTheFinalRunIsNotLost(t *testing.T) {
	runs := make(chan int32, 16)
	var n atomic.Int32
	var l *loop.Loop
	l = loop.New(loop.Config{Interval: time.Millisecond, Immediate: true}, func(context.Context) bool {
		k := n.Add(1)
		if k == 1 {
			l.Start()
		}
		runs <- k
		return false
	})
	defer l.Close()
	l.Start()
	wait(t, runs, "first run")
	if got := wait(t, runs, "run for the Start made during the first"); got != 2 {
		t.Fatalf("run %d, want 2", got)
	}
}

func TestLoopTimeoutBoundsEachRun(t *testing.T) {
	got := make(chan bool, 1)
	l := loop.New(loop.Config{Interval: time.Hour, Immediate: true, Timeout: time.Minute}, func(ctx context.Context) bool {
		_, ok := ctx.Deadline()
		got <- ok
		return false
	})
	defer l.Close()
	l.Start()
	if !wait(t, got, "run") {
		t.Fatal("run context has no deadline, want one from Timeout")
	}
}
