package workers_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/han-app/gateway/internal/workers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type job struct {
	block bool
	done  chan struct{}
}

// Jobs handed one after another reuse one worker (its grown stack); a
// burst beyond the pool is refused past the maximum (the caller runs
// those); idle workers go away; Close waits for the busy ones and refuses
// later jobs.
func TestPoolReusesRefusesAndExits(t *testing.T) {
	var handled atomic.Int64
	var gids sync.Map
	release := make(chan struct{})
	const max = 4
	p := workers.New(max, 100*time.Millisecond, func(j *job) {
		gids.Store(goroutineID(), true)
		if j.block {
			<-release
		}
		handled.Add(1)
		close(j.done)
	})
	run := func(block bool) (*job, bool) {
		j := &job{block: block, done: make(chan struct{})}
		return j, p.TryRun(j)
	}
	// Sequential jobs: one worker runs them all.
	for range 50 {
		j, ok := run(false)
		if !ok {
			t.Fatal("an idle pool refused a job")
		}
		<-j.done
		time.Sleep(time.Millisecond)
	}
	n := 0
	gids.Range(func(any, any) bool { n++; return true })
	if n > 2 {
		t.Fatalf("50 sequential jobs ran on %d goroutines, want them on a reused worker", n)
	}
	// A burst of blocking jobs: max are taken, the rest refused.
	var taken []*job
	refused := 0
	for range max + 3 {
		if j, ok := run(true); ok {
			taken = append(taken, j)
		} else {
			refused++
		}
	}
	if len(taken) != max || refused != 3 || p.Workers() != max {
		t.Fatalf("burst: %d taken, %d refused, %d workers; want %d, 3, %d", len(taken), refused, p.Workers(), max, max)
	}
	close(release)
	for _, j := range taken {
		<-j.done
	}
	if got := handled.Load(); got != int64(50+max) {
		t.Fatalf("handled %d jobs, want %d", got, 50+max)
	}
	// Idle workers exit on their own.
	deadline := time.Now().Add(5 * time.Second)
	for p.Workers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still running after being idle", p.Workers())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := run(false); !ok {
		t.Fatal("a pool whose workers exited refused a job")
	}
	p.Close()
	p.Close()
	if _, ok := run(false); ok {
		t.Fatal("a closed pool took a job")
	}
	if p.Workers() != 0 {
		t.Fatalf("%d workers after Close", p.Workers())
	}
}

// With idle 0 a worker stays until Close, which ends it.
func TestPoolWithoutIdleExitKeepsWorkers(t *testing.T) {
	done := make(chan struct{}, 1)
	p := workers.New(1, 0, func(struct{}) { done <- struct{}{} })
	if !p.TryRun(struct{}{}) {
		t.Fatal("refused")
	}
	<-done
	time.Sleep(50 * time.Millisecond)
	if p.Workers() != 1 {
		t.Fatalf("%d workers, want the one to stay", p.Workers())
	}
	p.Close()
	if p.Workers() != 0 {
		t.Fatalf("%d workers after Close", p.Workers())
	}
}

// Stop does not wait: it returns while a job still runs, refuses later
// jobs, ends the idle workers at once and the busy one after its job.
func TestPoolStopDoesNotWaitForBusyWorkers(t *testing.T) {
	started, finished := make(chan struct{}, 2), make(chan struct{}, 2)
	p := workers.New(2, 0, func(release chan struct{}) {
		started <- struct{}{}
		<-release
		finished <- struct{}{}
	})
	first, second := make(chan struct{}), make(chan struct{})
	for _, release := range []chan struct{}{first, second} {
		if !p.TryRun(release) {
			t.Fatal("refused")
		}
		<-started
	}
	close(first) // one worker idle, one busy
	<-finished
	stopped := make(chan struct{})
	go func() {
		p.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop waited for a busy worker")
	}
	if p.TryRun(make(chan struct{})) {
		t.Fatal("a stopped pool took a job")
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Workers() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers after Stop, want only the busy one", p.Workers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(second)
	p.Close() // waits for the last one
	if p.Workers() != 0 {
		t.Fatalf("%d workers after the busy one finished", p.Workers())
	}
}

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
