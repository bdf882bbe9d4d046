package rds_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Concurrent callers share pipelines, and each still gets its own reply:
// the reserve of key i answers with the owner that reserved key i, even
// while Redis keeps forgetting its scripts (SCRIPT FLUSH, as after a
// restart), and every publish reaches the subscriber once.
func TestBatcherEachCallerGetsItsOwnReply(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(3))
	admin := apiClient(t, env.Redis.AdminURL(3))
	b := rds.NewBatcher(c)

	sub := c.Subscribe(ctx, "han:rt:test:batch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1024)
	go func() {
		for m := range sub.Channel() {
			got <- m.Payload
		}
	}()

	flushing, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flushing)
		for {
			select {
			case <-stop:
				return
			default:
				admin.ScriptFlush(ctx)
			}
		}
	}()
	const callers, perCaller = 16, 30
	keys := func(i int) []string {
		return []string{"han:api:idem:{batch:" + strconv.Itoa(i) + "}", "han:api:idemlock:{batch:" + strconv.Itoa(i) + "}", "han:api:idemgone:{batch:" + strconv.Itoa(i) + "}"}
	}
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for j := range perCaller {
				i := g*perCaller + j
				first := lua.IdemReserve
				var v []any
				var err error
				if j%3 == 0 {
					// Two calls of one caller in one pipeline, in order:
					// the second sees the first's write.
					cmds := b.Scripts(ctx, rds.ScriptCall{Script: first, Keys: keys(i), Args: []any{"fp", "owner-" + strconv.Itoa(i), 60000}},
						rds.ScriptCall{Script: first, Keys: keys(i), Args: []any{"fp", "other", 60000}})
					if v, err = cmds[0].Slice(); err != nil || v[0] != "acquired" {
						t.Errorf("grouped reserve %d: %v %v", i, v, err)
						return
					}
					v, err = cmds[1].Slice()
				} else {
					v, err = b.Script(ctx, first, keys(i), "fp", "owner-"+strconv.Itoa(i), 60000).Slice()
					if err != nil || v[0] != "acquired" {
						t.Errorf("reserve %d: %v %v", i, v, err)
						return
					}
					// The same key again: in progress, held by this key's owner.
					v, err = b.Script(ctx, first, keys(i), "fp", "other", 60000).Slice()
				}
				if err != nil || len(v) < 4 || v[0] != "in_progress" || v[3] != "owner-"+strconv.Itoa(i) {
					t.Errorf("second reserve %d: %v %v", i, v, err)
					return
				}
				if n, err := b.Publish(ctx, rds.PubSubAuto, "han:rt:test:batch", []byte(strconv.Itoa(i))).Result(); err != nil || n != 1 {
					t.Errorf("publish %d: %d %v", i, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-flushing
	if t.Failed() {
		t.FailNow()
	}
	seen := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < callers*perCaller {
		select {
		case p := <-got:
			if seen[p] {
				t.Fatalf("payload %s delivered twice", p)
			}
			seen[p] = true
		case <-deadline:
			t.Fatalf("%d of %d publishes arrived", len(seen), callers*perCaller)
		}
	}
}

// A caller whose context ended gets its context's error and sends nothing;
// the calls batched with it are answered as usual.
func TestBatcherCanceledCallerSendsNothing(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(3))
	b := rds.NewBatcher(c)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	key := []string{"han:api:idem:{batch:gone}", "han:api:idemlock:{batch:gone}", "han:api:idemgone:{batch:gone}"}
	if err := b.Script(gone, lua.IdemReserve, key, "fp", "o", 60000).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled script: %v", err)
	}
	if err := b.Publish(gone, rds.PubSubAuto, "han:rt:test:gone", []byte("x")).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled publish: %v", err)
	}
	if err := b.Publish(ctx, rds.PubSubSharded, "han:rt:test:gone", []byte("x")).Err(); !errors.Is(err, rds.ErrShardedNeedsCluster) {
		t.Fatalf("sharded publish on a standalone Redis: %v", err)
	}
	if n, err := c.Exists(ctx, key...).Result(); err != nil || n != 0 {
		t.Fatalf("a canceled call wrote %d keys (%v)", n, err)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			cctx := ctx
			if i%2 == 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			k := []string{"han:api:idem:{batch:c" + strconv.Itoa(i) + "}", "han:api:idemlock:{batch:c" + strconv.Itoa(i) + "}", "han:api:idemgone:{batch:c" + strconv.Itoa(i) + "}"}
			v, err := b.Script(cctx, lua.IdemReserve, k, "fp", "o", 60000).Slice()
			switch {
			case i%2 == 0 && !errors.Is(err, context.Canceled):
				t.Errorf("call %d: canceled, got %v %v", i, v, err)
			case i%2 == 1 && (err != nil || v[0] != "acquired"):
				t.Errorf("call %d: %v %v", i, v, err)
			}
		})
	}
	wg.Wait()
}

// Pipelines of calls nobody waits for, one after another, are each
// answered (they go out on the batcher's long-lived senders), and Close
// ends those senders.
func TestBatcherLaterPipelinesOneAfterAnother(t *testing.T) {
	c := apiClient(t, env.Redis.URL(3))
	before := runtime.NumGoroutine()
	b := rds.NewBatcher(c)
	for i := range 20 {
		got := make(chan error, 1)
		b.PublishLater(rds.PubSubAuto, "han:rt:test:seq", []byte("x"), func(err error) { got <- err })
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publish %d never answered", i)
		}
	}
	b.Close()
	testenv.Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before },
		"%d goroutines after Close, %d before the batcher", runtime.NumGoroutine(), before)
}

// Calls nobody waits for gather into shared pipelines; Close sends what is
// queued and returns only once every reply is in, and later calls after
// Close fail at once instead of being lost silently.
func TestBatcherLaterCallsAreSentByClose(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(3))
	b := rds.NewBatcher(c)
	const n = 150 // more than one pipeline's worth
	var mu sync.Mutex
	replies := map[int]string{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := []string{"han:api:idem:{later:" + strconv.Itoa(i) + "}", "han:api:idemlock:{later:" + strconv.Itoa(i) + "}", "han:api:idemgone:{later:" + strconv.Itoa(i) + "}"}
			b.ScriptLater(lua.IdemReserve, k, []any{"fp", "o-" + strconv.Itoa(i), 60000}, func(cmd *redis.Cmd) {
				v, err := cmd.Slice()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					replies[i] = err.Error()
					return
				}
				replies[i], _ = v[0].(string)
			})
		})
	}
	wg.Wait()
	b.Close()
	mu.Lock()
	for i := range n {
		if replies[i] != "acquired" {
			t.Errorf("call %d: %q", i, replies[i])
		}
	}
	mu.Unlock()
	for i := range n {
		if owner := c.Get(ctx, "han:api:idemlock:{later:"+strconv.Itoa(i)+"}").Val(); owner != "o-"+strconv.Itoa(i) {
			t.Fatalf("lock %d held by %q", i, owner)
		}
	}
	var after error
	b.PublishLater(rds.PubSubAuto, "han:rt:test:later", []byte("x"), func(err error) { after = err })
	if !errors.Is(after, rds.ErrRedisUnavailable) {
		t.Fatalf("a later call after Close: %v", after)
	}
}

// A call nobody waits for that is queued when a waited-for pipeline goes
// out rides on it instead of waiting for its own: it is answered, with its
// own reply, by the time the waited-for call returns. A waited-for call
// whose budget is short takes no rides (they keep their own deadline).
func TestBatcherLaterCallsRideOnWaitedPipelines(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(3))
	b := rds.NewBatcher(c)
	defer b.Close()
	keys := func(tag string, i int) []string {
		s := tag + ":" + strconv.Itoa(i)
		return []string{"han:api:idem:{ride:" + s + "}", "han:api:idemlock:{ride:" + s + "}", "han:api:idemgone:{ride:" + s + "}"}
	}
	const n = 40
	answered := 0
	for i := range n {
		got := make(chan string, 1)
		b.ScriptLater(lua.IdemReserve, keys("later", i), []any{"fp", "later-" + strconv.Itoa(i), 60000}, func(cmd *redis.Cmd) {
			v, err := cmd.Slice()
			if err != nil {
				got <- err.Error()
				return
			}
			got <- v[0].(string)
		})
		v, err := b.Script(ctx, lua.IdemReserve, keys("now", i), "fp", "now-"+strconv.Itoa(i), 60000).Slice()
		if err != nil || v[0] != "acquired" {
			t.Fatalf("waited-for reserve %d: %v %v", i, v, err)
		}
		select {
		case r := <-got:
			answered++
			if r != "acquired" {
				t.Fatalf("riding reserve %d: %s", i, r)
			}
		default: // its timer took it first (a slow machine): it still gets its reply
			if r := <-got; r != "acquired" {
				t.Fatalf("later reserve %d: %s", i, r)
			}
		}
		// Each call did its own work: the lock holds its own owner.
		if o, err := c.Get(ctx, keys("later", i)[1]).Result(); err != nil || o != "later-"+strconv.Itoa(i) {
			t.Fatalf("later lock %d: %q %v", i, o, err)
		}
	}
	st := b.LaterStats()
	if st.Calls != n || st.Rides != uint64(answered) || answered < n/2 {
		t.Fatalf("stats %+v: %d of %d answered by the waited-for call's return (want most)", st, answered, n)
	}

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	b.ScriptLater(lua.IdemReserve, keys("later", n), []any{"fp", "x", 60000}, func(*redis.Cmd) { close(done) })
	if err := b.Script(short, lua.IdemReserve, keys("now", n), "fp", "y", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := b.LaterStats().Rides; got != st.Rides {
		t.Fatalf("a call with a 100ms budget carried rides (%d → %d)", st.Rides, got)
	}
}

// scriptTrips records, per round trip a client sends (one command or one
// pipeline), how many script calls it carried, for those that carried any.
type scriptTrips struct {
	mu    sync.Mutex
	trips []int
}

func (p *scriptTrips) record(cmds ...redis.Cmder) {
	n := 0
	for _, c := range cmds {
		if name := c.Name(); name == "evalsha" || name == "eval" {
			n++
		}
	}
	if n > 0 {
		p.mu.Lock()
		p.trips = append(p.trips, n)
		p.mu.Unlock()
	}
}

func (p *scriptTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *scriptTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.record(cmd)
		return next(ctx, cmd)
	}
}

func (p *scriptTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.record(cmds...)
		return next(ctx, cmds)
	}
}

// With a linger, a call that finds the pipeline free waits for other
// callers' scripts: those that arrive within it share its round trip, and
// each still gets its own reply.
func TestBatcherLingerSharesOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(3))
	b := rds.NewBatcher(c)
	b.SetLinger(300 * time.Millisecond)
	defer b.Close()
	// Load the script once, so the shared pipeline needs no second try.
	if err := b.Script(ctx, lua.IdemReserve, []string{"han:api:idem:{linger:warm}", "han:api:idemlock:{linger:warm}", "han:api:idemgone:{linger:warm}"}, "fp", "w", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	var st scriptTrips
	c.AddHook(&st)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 4 {
		wg.Go(func() {
			tag := "{linger:" + strconv.Itoa(i) + "}"
			v, err := b.Script(ctx, lua.IdemReserve, []string{"han:api:idem:" + tag, "han:api:idemlock:" + tag, "han:api:idemgone:" + tag}, "fp", "owner-"+strconv.Itoa(i), 60000).Slice()
			if err != nil || v[0] != "acquired" {
				t.Errorf("reserve %d: %v %v", i, v, err)
			}
			if o, err := c.Get(ctx, "han:api:idemlock:"+tag).Result(); err != nil || o != "owner-"+strconv.Itoa(i) {
				t.Errorf("lock %d: %q %v", i, o, err)
			}
		})
		if i == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg.Wait()
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("the first call was answered after %v, before its linger ended", waited)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.trips) != 1 || st.trips[0] != 4 {
		t.Fatalf("script calls per round trip %v, want the four reserves in one", st.trips)
	}
}

// A caller queued behind pipelines that a stalled Redis holds leaves at its
// own deadline with its context's error — all of its calls, a request's
// several scripts too — instead of waiting for the stalled pipelines to
// end, and nothing of it reaches Redis afterwards.
func TestBatcherQueuedCallerLeavesAStalledRedisAtItsDeadline(t *testing.T) {
	r, c := testenv.StallableRedis(t, 0, 10*time.Second)
	b := rds.NewBatcher(c)
	ctx := context.Background()
	keys := func(name string) []string {
		return []string{"han:api:idem:{stall:" + name + "}", "han:api:idemlock:{stall:" + name + "}", "han:api:idemgone:{stall:" + name + "}"}
	}
	if err := b.Script(ctx, lua.IdemReserve, keys("warm"), "fp", "o", 60000).Err(); err != nil {
		t.Fatal(err) // loaded, as on a running service
	}
	sc := c.(*redis.Client)
	busy := func() int { s := sc.PoolStats(); return int(s.TotalConns - s.IdleConns) }
	base := busy()
	thaw := r.Freeze(t)
	order := make(chan string, 3)
	var wg sync.WaitGroup
	for _, name := range []string{"a1", "a2"} { // both pipelines in flight, stalled
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			b.Script(actx, lua.IdemReserve, keys(name), "fp", "o", 60000)
			order <- name
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for busy() < base+2 {
		if time.Now().After(deadline) {
			t.Fatal("the two stalled pipelines never took their connections")
		}
		time.Sleep(time.Millisecond)
	}
	bctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	res := b.Scripts(bctx,
		rds.ScriptCall{Script: lua.IdemReserve, Keys: keys("b1"), Args: []any{"fp", "o", 60000}},
		rds.ScriptCall{Script: lua.IdemReserve, Keys: keys("b2"), Args: []any{"fp", "o", 60000}})
	order <- "b"
	for i, cmd := range res {
		if !errors.Is(cmd.Err(), context.DeadlineExceeded) {
			t.Errorf("queued call %d: %v, want context.DeadlineExceeded", i, cmd.Err())
		}
	}
	if first := <-order; first != "b" {
		t.Fatalf("%s returned first: the queued caller waited for the stalled pipelines", first)
	}
	thaw()
	wg.Wait()
	testenv.WarmPool(t, c)
	if n, err := c.Exists(ctx, append(keys("b1"), keys("b2")...)...).Result(); err != nil || n != 0 {
		t.Fatalf("the calls that left wrote %d keys (%v)", n, err)
	}
}
