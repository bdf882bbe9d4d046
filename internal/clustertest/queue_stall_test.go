package clustertest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

// One stalled master (stopped, before any failover) must not hold the
// project queue's calls for the other masters: a project whose keys live on
// a healthy master publishes, claims and acks within the request's Redis
// budget (1 s) and without error while the calls of a project on the
// stalled master fail, and those work again once it wakes. The queue merges
// the publishes, claims and acks of concurrent requests into shared round
// trips (store/project/merge.go), and go-redis answers a cluster pipeline
// only once every node in it has answered. The stalled master is not the
// one holding the environment's module budget, which every project's
// publishes lease bytes from.
func TestQueueHealthyProjectsAnswerWhileOneMasterStalls(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
	const env = "stall"
	q := project.NewQueue(rdb, project.NewModuleBudget(rdb, env, 64<<20), project.QueueConfig{})
	const budget = time.Second // the request's Redis budget

	module, err := c.MasterOf(ctx, project.NewModuleKeys(env).Budget())
	if err != nil {
		t.Fatal(err)
	}
	var victim *testenv.RedisServer
	for _, n := range c.Nodes[:3] { // the masters
		if n.Addr() != module.Addr() {
			victim = n
			break
		}
	}
	projects := queueProjectsByMaster(t, c, q)
	stalled := projects[victim.Addr()]
	var healthy []*queueProject
	for addr, p := range projects {
		if addr != victim.Addr() {
			healthy = append(healthy, p)
		}
	}
	for _, p := range projects { // load the scripts, learn the topics and subscriptions
		if err := p.round(ctx, q, budget); err != nil {
			t.Fatal(err)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	stop := make(chan struct{})
	var stalledFailed atomic.Int64
	var wg sync.WaitGroup
	// Producers and consumers of the project on the stalled master: they
	// fill its round trips and its queue.
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := stalled.round(ctx, q, budget); err != nil {
					stalledFailed.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	var rounds int
	var firstBad error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); rounds++ {
		if err := healthy[rounds%len(healthy)].round(ctx, q, budget); err != nil && firstBad == nil {
			firstBad = err
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	thaw()
	wg.Wait()
	t.Logf("%d rounds of publish, claim and ack on projects of the healthy masters while one stalled; %d failed rounds on the stalled master",
		rounds, stalledFailed.Load())
	if stalledFailed.Load() == 0 {
		t.Fatal("no round on the stalled master failed: the master did not stall")
	}
	if firstBad != nil {
		t.Fatalf("a stalled master held the queue calls of a project on a healthy master: %v", firstBad)
	}
	// The stalled master's project works again once it wakes.
	var err2 error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err2 = stalled.round(ctx, q, budget); err2 == nil {
			return
		}
	}
	t.Fatalf("the project on the master that stalled still fails after it woke: %v", err2)
}

// queueProject is a project with one topic and one subscription of it.
type queueProject struct {
	id       string
	k        project.Keys
	tid, sid string
	n        atomic.Int64 // client event ids
}

// queueProjectsByMaster creates a project (topic and subscription) on
// every master of c, by master address.
func queueProjectsByMaster(t *testing.T, c *testenv.RedisCluster, q *project.Queue) map[string]*queueProject {
	t.Helper()
	ctx := context.Background()
	out := map[string]*queueProject{}
	for i := 0; len(out) < 3; i++ {
		if i > 1000 {
			t.Fatal("could not place projects on 3 masters")
		}
		p := &queueProject{id: ids.New()}
		p.k = project.NewKeys("stall", p.id)
		m, err := c.MasterOf(ctx, p.k.Meta())
		if err != nil {
			t.Fatal(err)
		}
		if out[m.Addr()] != nil {
			continue
		}
		top, err := q.CreateTopic(ctx, p.k, ids.New(), "orders", "")
		if err != nil {
			t.Fatal(err)
		}
		sub, err := q.CreateSubscription(ctx, p.k, ids.New(), top.ID, "billing")
		if err != nil {
			t.Fatal(err)
		}
		p.tid, p.sid = top.ID, sub.ID
		out[m.Addr()] = p
	}
	return out
}

// round publishes a message, claims one and acks what it claimed, each
// call with its own budget as a request's; it returns the first call that
// failed or outlasted its budget.
func (p *queueProject) round(ctx context.Context, q *project.Queue, budget time.Duration) error {
	call := func(name string, f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		start := time.Now()
		err := f(cctx)
		if took := time.Since(start); err == nil && took > budget {
			err = fmt.Errorf("answered after %v, past its %v budget", took.Round(time.Millisecond), budget)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	err := call("publish", func(ctx context.Context) error {
		in := project.PublishInput{ProducerID: "prod", ClientEventID: fmt.Sprint(p.n.Add(1)), Payload: []byte(`{"a":1}`)}
		_, _, err := q.Publish(ctx, p.k, p.id, p.tid, in)
		return err
	})
	if err != nil {
		return err
	}
	var items []project.ClaimItem
	if err := call("claim", func(ctx context.Context) (err error) {
		items, err = q.Claim(ctx, p.k, p.sid, 1, false)
		return err
	}); err != nil {
		return err
	}
	for _, it := range items {
		if err := call("ack", func(ctx context.Context) error {
			_, _, err := q.Ack(ctx, p.k, p.sid, it.Message.ID, it.Token, "processed", "")
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}
