package combine_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/han-app/gateway/internal/combine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type call struct {
	id    int
	group int // the caller's calls share a group id
	done  atomic.Int32
}

// Every call is executed exactly once, no batch is larger than Max, no
// more than InFlight batches run at once, one caller's calls keep their
// order (a caller's calls that find a batch free go out together), and
// concurrent callers really share batches — with and without a linger.
func TestCombinerSharesBatchesAndExecutesEachCallOnce(t *testing.T) {
	for _, linger := range []time.Duration{0, 200 * time.Microsecond} {
		t.Run(linger.String(), func(t *testing.T) { testCombinerShares(t, linger) })
	}
}

func testCombinerShares(t *testing.T, linger time.Duration) {
	var (
		mu      sync.Mutex
		running int
		peak    int
		batches int
		order   = map[int][]int{} // group → ids in execution order
	)
	c := &combine.Combiner[*call]{InFlight: 2, Max: 8, Linger: linger}
	c.Exec = func(batch []*call) {
		mu.Lock()
		running++
		peak = max(peak, running)
		batches++
		if len(batch) > 8 {
			t.Errorf("a batch of %d calls", len(batch))
		}
		for _, cl := range batch {
			order[cl.group] = append(order[cl.group], cl.id)
		}
		mu.Unlock()
		time.Sleep(100 * time.Microsecond) // a round trip: others queue meanwhile
		for _, cl := range batch {
			cl.done.Add(1)
		}
		mu.Lock()
		running--
		mu.Unlock()
	}
	const callers, rounds = 64, 50
	all := make([]*call, 0, callers*rounds*2)
	var allMu sync.Mutex
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for r := range rounds {
				a := &call{id: 2 * r, group: g}
				b := &call{id: 2*r + 1, group: g}
				c.Do(a, b)
				if a.done.Load() != 1 || b.done.Load() != 1 {
					t.Errorf("Do returned before its calls ran: %d %d", a.done.Load(), b.done.Load())
				}
				allMu.Lock()
				all = append(all, a, b)
				allMu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, cl := range all {
		if n := cl.done.Load(); n != 1 {
			t.Fatalf("call %d/%d executed %d times", cl.group, cl.id, n)
		}
	}
	if peak > 2 {
		t.Fatalf("%d batches ran at once, InFlight is 2", peak)
	}
	for g, ids := range order {
		for i, id := range ids {
			if id != i {
				t.Fatalf("caller %d's calls ran in order %v", g, ids)
			}
		}
	}
	if total := callers * rounds * 2; batches >= total/2 {
		t.Fatalf("%d batches for %d calls: concurrent calls did not share batches", batches, total)
	}
}

// A lone call runs at once on its caller's goroutine.
func TestCombinerLoneCallRunsAtOnce(t *testing.T) {
	var ran bool
	c := &combine.Combiner[*call]{Max: 4, Exec: func(batch []*call) { ran = len(batch) == 1 }}
	c.Do(&call{})
	if !ran {
		t.Fatal("a lone call was not executed alone before Do returned")
	}
}

// One caller's calls as many as Max, or more, go out at once when a batch
// is free (they once waited in the queue for a batch in flight to take
// them, and with none in flight waited forever).
func TestCombinerCallsUpToMaxAndBeyondRunAtOnce(t *testing.T) {
	for _, n := range []int{4, 5, 9} {
		var got []int
		c := &combine.Combiner[*call]{Max: 4, Exec: func(batch []*call) { got = append(got, len(batch)) }}
		done := make(chan struct{})
		go func() {
			defer close(done)
			calls := make([]*call, n)
			for i := range calls {
				calls[i] = &call{}
			}
			c.Do(calls...)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d calls of one caller with Max 4 never ran", n)
		}
		if len(got) != 1 || got[0] != n {
			t.Fatalf("%d calls ran as batches %v, want one of %d", n, got, n)
		}
	}
}

// With a linger, a call that finds a batch free waits for company: calls
// that arrive meanwhile (even with a second batch free) join its batch.
func TestCombinerLingerGathersCallsThatArriveMeanwhile(t *testing.T) {
	var (
		mu    sync.Mutex
		sizes []int
	)
	c := &combine.Combiner[*call]{InFlight: 2, Max: 8, Linger: 300 * time.Millisecond, Exec: func(batch []*call) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
	}}
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { c.Do(&call{id: 0}) })
	time.Sleep(20 * time.Millisecond)
	for i := 1; i <= 3; i++ {
		wg.Go(func() { c.Do(&call{id: i}) })
	}
	wg.Wait()
	if len(sizes) != 1 || sizes[0] != 4 {
		t.Fatalf("batches %v, want one of 4 calls", sizes)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("the batch left after %v, before its linger", waited)
	}
}

// A lingering batch leaves as soon as the calls that joined it fill it.
func TestCombinerLingerEndsWhenTheBatchFills(t *testing.T) {
	var sizes []int
	var mu sync.Mutex
	c := &combine.Combiner[*call]{Max: 3, Linger: time.Hour, Exec: func(batch []*call) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		wg.Go(func() { c.Do(&call{}) })
		time.Sleep(20 * time.Millisecond)
		wg.Go(func() { c.Do(&call{}, &call{}) })
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a full batch kept lingering")
	}
	if len(sizes) != 1 || sizes[0] != 3 {
		t.Fatalf("batches %v, want one of 3 calls", sizes)
	}
}

// A call queued behind a stalled batch leaves when its caller's context
// ends, with the context's error, and is never executed; the calls queued
// behind it still go out, in one batch, once the stall ends. A call whose
// context ends only after it was taken into a batch is executed.
func TestCombinerQueuedCallLeavesWhenItsContextEnds(t *testing.T) {
	stall := make(chan struct{})
	started := make(chan struct{})
	late, cancelLate := context.WithCancel(context.Background())
	defer cancelLate()
	var log batchLog
	c := &combine.Combiner[*call]{Max: 8, Exec: func(batch []*call) {
		log.record(batch)
		switch batch[0].id {
		case 0:
			close(started)
			<-stall
		case 2:
			cancelLate() // while its calls are in this batch
		}
	}}
	var wg sync.WaitGroup
	wg.Go(func() { c.Do(&call{id: 0}) })
	<-started
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	left := &call{id: 1}
	errc := make(chan error, 1)
	wg.Go(func() { errc <- c.DoCtx(short, left) })
	time.Sleep(10 * time.Millisecond) // queued first: the next batch's executor
	taken := []*call{{id: 2}, {id: 3}}
	for _, cl := range taken {
		wg.Go(func() {
			if err := c.DoCtx(late, cl); err != nil {
				t.Errorf("call %d, taken into a batch before its context ended: %v", cl.id, err)
			}
		})
	}
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("queued call past its deadline: %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a queued call waited past its deadline for a stalled batch")
	}
	close(stall)
	wg.Wait()
	if n := left.done.Load(); n != 0 {
		t.Fatalf("the call that left was executed %d times", n)
	}
	for _, cl := range taken {
		if n := cl.done.Load(); n != 1 {
			t.Fatalf("call %d queued behind the one that left was executed %d times", cl.id, n)
		}
	}
	if batches := log.list(); len(batches) != 2 || len(batches[1]) != 2 {
		t.Fatalf("batches %v, want the stalled one and one of the two calls left", batches)
	}
}

// A caller's calls queued together behind a stalled batch leave together
// when its context ends, unexecuted, with the context's error. Taken into a
// batch (together, even beyond Max), they are waited for instead: DoCtx
// returns nil only after that batch ended, since their outcome is written
// into them.
func TestCombinerCallerWithSeveralCallsLeavesOrIsWaitedFor(t *testing.T) {
	stall0, stall1 := make(chan struct{}), make(chan struct{})
	started0, started1 := make(chan struct{}), make(chan struct{})
	var (
		log   batchLog
		ended atomic.Bool // the batch holding the first caller's calls ended
	)
	c := &combine.Combiner[*call]{Max: 3, Exec: func(batch []*call) {
		log.record(batch)
		switch batch[0].id {
		case 0:
			close(started0)
			<-stall0
		case 10:
			close(started1)
			<-stall1
			ended.Store(true)
		}
	}}
	queued := func(n int) { t.Helper(); waitQueued(t, c, n) }
	type result struct {
		err   error
		ended bool
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.Do(&call{id: 0}) })
	<-started0
	wg.Go(func() { c.Do(&call{id: 10}) }) // the next batch's executor
	queued(1)
	takenCtx, cancelTaken := context.WithCancel(context.Background())
	defer cancelTaken()
	taken := []*call{{id: 1}, {id: 2}, {id: 3}}
	takenRes := make(chan result, 1)
	wg.Go(func() {
		err := c.DoCtx(takenCtx, taken...)
		takenRes <- result{err, ended.Load()}
	})
	queued(4)
	close(stall0) // 10 with 1, 2 and 3 (beyond Max: one caller's calls stay together), which stalls
	<-started1
	queued(0)
	leftCtx, cancelLeft := context.WithCancel(context.Background())
	left := []*call{{id: 4}, {id: 5}}
	leftRes := make(chan error, 1)
	wg.Go(func() { leftRes <- c.DoCtx(leftCtx, left...) })
	queued(2)
	cancelTaken()
	cancelLeft()
	if err := <-leftRes; !errors.Is(err, context.Canceled) { // while the batch in flight stalls
		t.Fatalf("queued calls whose context ended: %v, want context.Canceled", err)
	}
	queued(0)
	close(stall1)
	r := <-takenRes
	wg.Wait()
	if r.err != nil || !r.ended {
		t.Fatalf("calls taken into a batch: DoCtx returned %v, the batch ended before: %v; want nil after the batch", r.err, r.ended)
	}
	for _, cl := range taken {
		if n := cl.done.Load(); n != 1 {
			t.Fatalf("taken call %d executed %d times", cl.id, n)
		}
	}
	for _, cl := range left {
		if n := cl.done.Load(); n != 0 {
			t.Fatalf("call %d that left executed %d times", cl.id, n)
		}
	}
	if batches := log.list(); len(batches) != 2 || !slices.Equal(batches[1], []int{10, 1, 2, 3}) {
		t.Fatalf("batches %v, want [0] and [10 1 2 3]", batches)
	}
}

// A caller's calls are never split between batches: were its first call
// the last of a batch that stalls and its second the head of the next
// batch, the calls of other callers in that next batch would wait for the
// stalled one (the caller executes the batch it heads only once its first
// call is answered) — past their own deadlines, with a batch slot free.
func TestCombinerKeepsACallersCallsInOneBatch(t *testing.T) {
	stall0, stall1, stallX := make(chan struct{}), make(chan struct{}), make(chan struct{})
	started0, started1, startedX := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var log batchLog
	c := &combine.Combiner[*call]{Max: 2, InFlight: 2, Exec: func(batch []*call) {
		log.record(batch)
		switch batch[0].id {
		case 0:
			close(started0)
			<-stall0
		case 100:
			close(started1)
			<-stall1
		case 1:
			close(startedX)
			<-stallX
		}
	}}
	queued := func(n int) { t.Helper(); waitQueued(t, c, n) }
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { c.Do(&call{id: 0}) })
	<-started0
	wg.Go(func() { c.Do(&call{id: 100}) })
	<-started1
	wg.Go(func() { c.Do(&call{id: 1}) }) // X: heads the next batch, which stalls
	queued(1)
	wg.Go(func() { c.Do(&call{id: 11}, &call{id: 12}) }) // A's two calls
	queued(3)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	cDone := make(chan error, 1)
	wg.Go(func() { cDone <- c.DoCtx(ctx, &call{id: 30}) }) // C, behind A
	queued(4)
	close(stall0) // X's batch goes out and stalls
	<-startedX
	close(stall1) // a slot is free for what is queued
	select {
	case <-cDone:
	case <-time.After(5 * time.Second):
		close(stallX)
		t.Fatalf("a call behind a caller split across batches waited for the stalled batch; batches %v", log.list())
	}
	close(stallX)
	wg.Wait()
	batches := log.list()
	for _, b := range batches {
		i11, i12 := slices.Index(b, 11), slices.Index(b, 12)
		if (i11 < 0) != (i12 < 0) || (i11 >= 0 && i12 != i11+1) {
			t.Fatalf("a caller's calls split or reordered between batches: %v", batches)
		}
	}
}

// waitQueued waits until n calls wait in c's queue.
func waitQueued(t *testing.T, c *combine.Combiner[*call], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", c.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// batchLog records the calls' ids of every batch executed, and counts each
// call's executions in the call.
type batchLog struct {
	mu      sync.Mutex
	batches [][]int
}

func (l *batchLog) record(batch []*call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]int, len(batch))
	for i, cl := range batch {
		ids[i] = cl.id
		cl.done.Add(1)
	}
	l.batches = append(l.batches, ids)
}

func (l *batchLog) list() [][]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.batches)
}

// A shared batch is not cut short by one caller leaving, but once every
// caller has left nobody waits for it: it ends then, not at the latest
// deadline among theirs (an instance shutting down cancels the callers of
// a statement that PostgreSQL stopped answering).
func TestSharedContextEndsOnceEveryCallerHasLeft(t *testing.T) {
	ctxOf := func(c context.Context) context.Context { return c }
	a, cancelA := context.WithTimeout(context.Background(), time.Hour)
	defer cancelA()
	b, cancelB := context.WithTimeout(context.Background(), time.Hour)
	defer cancelB()
	shared, cancel := combine.SharedContext([]context.Context{a, b}, ctxOf, time.Hour)
	defer cancel()
	cancelA()
	select {
	case <-shared.Done():
		t.Fatal("the shared batch ended when one of its two callers left")
	case <-time.After(50 * time.Millisecond):
	}
	cancelB()
	select {
	case <-shared.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shared batch still runs after every caller left")
	}

	// A caller whose context never ends keeps the batch to its deadline.
	c, cancelC := context.WithCancel(context.Background())
	shared2, cancel2 := combine.SharedContext([]context.Context{c, context.Background()}, ctxOf, time.Hour)
	defer cancel2()
	cancelC()
	select {
	case <-shared2.Done():
		t.Fatal("the shared batch ended although a caller that cannot leave waits for it")
	case <-time.After(50 * time.Millisecond):
	}
	if d, ok := shared2.Deadline(); !ok || time.Until(d) < 59*time.Minute {
		t.Fatalf("the batch's deadline is %v, want the budget's hour", d)
	}
}

// A batch whose callers all reached their deadlines ends by its own
// deadline, so it reads as past its budget (DeadlineExceeded), never as
// canceled: the callers' answers tell a busy database from a client that
// went away by that.
func TestSharedContextOfCallersPastTheirDeadlinesEndsByItsDeadline(t *testing.T) {
	ctxOf := func(c context.Context) context.Context { return c }
	for range 50 {
		d := time.Now().Add(20 * time.Millisecond)
		a, cancelA := context.WithDeadline(context.Background(), d)
		b, cancelB := context.WithDeadline(context.Background(), d)
		shared, cancel := combine.SharedContext([]context.Context{a, b}, ctxOf, time.Hour)
		<-shared.Done()
		if !errors.Is(shared.Err(), context.DeadlineExceeded) {
			t.Fatalf("the batch of callers past their deadlines ended with %v, want DeadlineExceeded", shared.Err())
		}
		cancel()
		cancelA()
		cancelB()
	}
}
