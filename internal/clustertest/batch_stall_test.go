package clustertest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// stallCluster is a cluster of its own that does not fail over while a
// test stalls a master (a 15 s node timeout), and a client of it with the
// service's defaults.
func stallCluster(t *testing.T) (*testenv.RedisCluster, redis.UniversalClient) {
	t.Helper()
	c := ownCluster(t, testenv.ClusterOptions{NodeTimeout: 15 * time.Second})
	rdb, err := rds.NewRedis(c.URL(), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return c, rdb
}

// One stalled master (stopped, before any failover) must not hold the
// Redis calls of the healthy masters: a request's publishes (sharded, and
// classic on a cluster), its script calls and the publishes nobody waits
// for are answered at the healthy masters' speed while the stalled master's
// own callers time out, and those recover once it wakes. The service shares
// pipelines between callers (rds.Batcher), and go-redis answers a cluster
// pipeline only once every node in it has answered.
func TestHealthyMastersAnswerWhileOneStalls(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
	b := rds.NewBatcher(rdb)
	defer b.Close()

	victim := c.Nodes[0]
	byMaster := channelsByMaster(t, c, 1)
	keysOn := map[string][]string{} // master address → the idempotency keys of one place on it
	for n := 0; len(keysOn) < 3; n++ {
		keys := idemKeys(place{n: 1000 + n})
		m, err := c.MasterOf(ctx, keys[0])
		if err != nil {
			t.Fatal(err)
		}
		if keysOn[m.Addr()] == nil {
			keysOn[m.Addr()] = keys
		}
	}
	type target struct {
		channel string
		keys    []string
	}
	stalled := target{byMaster[victim.Addr()][0], keysOn[victim.Addr()]}
	var healthy []target
	for addr, chs := range byMaster {
		if addr != victim.Addr() {
			healthy = append(healthy, target{chs[0], keysOn[addr]})
		}
	}

	// calls makes each kind of call on t's master with a 1 s budget (the
	// request's Redis budget) and returns the slowest and the first error.
	calls := func(tg target) (time.Duration, error) {
		var worst time.Duration
		var first error
		one := func(call func(context.Context) error) {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			start := time.Now()
			err := call(cctx)
			worst = max(worst, time.Since(start))
			if first == nil {
				first = err
			}
		}
		one(func(ctx context.Context) error {
			return b.Publish(ctx, rds.PubSubAuto, tg.channel, []byte("x")).Err()
		})
		one(func(ctx context.Context) error {
			return b.Publish(ctx, rds.PubSubClassic, tg.channel, []byte("x")).Err()
		})
		one(func(ctx context.Context) error {
			return b.Script(ctx, lua.IdemReserve, tg.keys, "fp", "owner", 30000).Err()
		})
		one(func(ctx context.Context) error {
			done := make(chan error, 1)
			b.PublishLater(rds.PubSubAuto, tg.channel, []byte("x"), func(err error) { done <- err })
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		return worst, first
	}
	for _, tg := range append(healthy, stalled) { // load the scripts, open the connections
		if _, err := calls(tg); err != nil {
			t.Fatal(err)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	stop := make(chan struct{})
	var stalledFailed atomic.Int64
	var wg sync.WaitGroup
	// Requests whose dialog lives on the stalled master: they fill its
	// pipelines and its queue.
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := calls(stalled); err != nil {
					stalledFailed.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	var rounds, bad int
	var worst time.Duration
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); rounds++ {
		tg := healthy[rounds%len(healthy)]
		d, err := calls(tg)
		worst = max(worst, d)
		if err != nil || d > 500*time.Millisecond {
			if bad++; bad == 1 {
				t.Logf("first slow or failed call on a healthy master: %v after %v", err, d.Round(time.Millisecond))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	thaw()
	wg.Wait()
	t.Logf("%d rounds of calls on the healthy masters while one stalled: %d slow or failed, worst %v; %d failed rounds on the stalled master",
		rounds, bad, worst.Round(time.Millisecond), stalledFailed.Load())
	if stalledFailed.Load() == 0 {
		t.Fatal("no call on the stalled master failed: the master did not stall")
	}
	if bad > 0 {
		t.Fatalf("a stalled master delayed or failed calls on the healthy masters: %d of %d rounds slower than 500ms or failed (worst %v, budget 1s)",
			bad, rounds, worst.Round(time.Millisecond))
	}
	// The stalled master's own calls work again once it wakes.
	recovered := false
	for end := time.Now().Add(5 * time.Second); !recovered && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		_, err := calls(stalled)
		recovered = err == nil
	}
	if !recovered {
		t.Fatal("calls on the master that stalled still fail after it woke")
	}
}
