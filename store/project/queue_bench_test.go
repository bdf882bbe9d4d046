package project_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// benchQueue is one queue implementation driven by runQueueBench.
type benchQueue interface {
	publish(ctx context.Context, i int) error
	// claim returns up to n leased message ids with their ack handles.
	claim(ctx context.Context, consumer, n int) ([][2]string, error)
	ack(ctx context.Context, id, token string) error
}

// BenchmarkProjectQueue measures publish → claim → ack throughput: 4
// producers publish messages while 16 consumers claim (10 at a time) and
// acknowledge each one, on the package's redis-server as api_backend. The
// baseline is the raw Redis Streams loop the design is compared with —
// XADD, XREADGROUP (COUNT 10) and XACK with go-redis — measured in the same
// run, interleaved with the project queue in five alternating rounds of
// b.N/5 messages each, so both see the same machine load (the shared
// two-core box is noisy). The project queue adds the module budget
// reservation and settlement, dedupe, receipts with fenced tokens, leases
// and the structure checks.
//
//	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -bench BenchmarkProjectQueue -benchtime 5000x -count 3 ./store/project/
func BenchmarkProjectQueue(b *testing.B) {
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{PoolSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	// The CPU per message of each arm, Redis's (user + system time of its
	// main thread) and the client's: on this shared machine the rates move
	// with the load, the CPU a message costs much less.
	admin := env.Redis.AdminClient(0)
	defer admin.Close()
	redisCPU := func() float64 {
		return redisCPUSeconds(b, admin, "used_cpu_user_main_thread", "used_cpu_sys_main_thread")
	}
	// The client's CPU (this process: producers, consumers, go-redis).
	clientCPU := func() float64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}

	payload := []byte(`{"body":"hello, this is a benchmark message of about one hundred bytes......","n":1}`)

	key := "han:prj:{bench:" + ids.New() + "}:raw"
	if err := rdb.XGroupCreateMkStream(ctx, key, "g", "$").Err(); err != nil {
		b.Fatal(err)
	}
	defer rdb.Del(ctx, key)
	raw := rawStreams{rdb: rdb, key: key, payload: string(payload)}

	env := "bench" + ids.New()[24:]
	pid := ids.New()
	k := project.NewKeys(env, pid)
	q := project.NewQueue(rdb, project.NewModuleBudget(rdb, env, 1<<40), project.QueueConfig{ProjectBudgetBytes: 1 << 40, ModuleLeaseBytes: project.ModuleLeaseMaxBytes})
	top, err := q.CreateTopic(ctx, k, ids.New(), "bench", "")
	if err != nil {
		b.Fatal(err)
	}
	sub, err := q.CreateSubscription(ctx, k, ids.New(), top.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer q.DeleteTopic(ctx, k, pid, top.ID)
	pq := projectQueue{q: q, k: k, pid: pid, topic: top.ID, sub: sub.ID, payload: payload, run: ids.New()}

	const rounds = 5
	per := max(b.N/rounds, 1)
	var rawTime, queueTime time.Duration
	var rawCPU, queueCPU, rawClient, queueClient float64
	b.ResetTimer()
	for r := range rounds {
		c0, g0 := redisCPU(), clientCPU()
		rawTime += runQueueBench(b, raw, r*per, per)
		c1, g1 := redisCPU(), clientCPU()
		queueTime += runQueueBench(b, pq, r*per, per)
		c2, g2 := redisCPU(), clientCPU()
		rawCPU, queueCPU = rawCPU+c1-c0, queueCPU+c2-c1
		rawClient, queueClient = rawClient+g1-g0, queueClient+g2-g1
	}
	b.StopTimer()
	n := float64(rounds * per)
	rawRate, queueRate := n/rawTime.Seconds(), n/queueTime.Seconds()
	b.ReportMetric(rawRate, "raw-msgs/s")
	b.ReportMetric(queueRate, "queue-msgs/s")
	b.ReportMetric(rawRate/queueRate, "raw/queue")
	b.ReportMetric(rawCPU*1e6/n, "raw-redis-µs/msg")
	b.ReportMetric(queueCPU*1e6/n, "queue-redis-µs/msg")
	b.ReportMetric(rawClient*1e6/n, "raw-client-µs/msg")
	b.ReportMetric(queueClient*1e6/n, "queue-client-µs/msg")
}

// runQueueBench pushes n messages (numbered from first) through q and
// returns how long publish → claim → ack took for all of them.
func runQueueBench(b *testing.B, q benchQueue, first, n int) time.Duration {
	ctx := context.Background()
	total := int64(n)
	var next, acked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > total {
					return
				}
				if err := q.publish(ctx, first+int(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for c := range 16 {
		wg.Go(func() {
			for acked.Load() < total {
				items, err := q.claim(ctx, c, 10)
				if err != nil {
					errs <- err
					return
				}
				if len(items) == 0 {
					// An empty queue: back off as a real consumer
					// would (the same for both implementations).
					time.Sleep(5 * time.Millisecond)
					continue
				}
				for _, it := range items {
					if err := q.ack(ctx, it[0], it[1]); err != nil {
						errs <- err
						return
					}
					acked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if acked.Load() != total {
		b.Fatalf("acked %d of %d", acked.Load(), total)
	}
	return elapsed
}

type rawStreams struct {
	rdb     redis.UniversalClient
	key     string
	payload string
}

func (r rawStreams) publish(ctx context.Context, i int) error {
	return r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.key, Values: []any{"p", "producer", "c", strconv.Itoa(i), "d", r.payload}}).Err()
}

func (r rawStreams) claim(ctx context.Context, consumer, n int) ([][2]string, error) {
	res, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c" + strconv.Itoa(consumer),
		Streams: []string{r.key, ">"}, Count: int64(n), Block: -1}).Result()
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, s := range res {
		for _, m := range s.Messages {
			out = append(out, [2]string{m.ID, ""})
		}
	}
	return out, nil
}

func (r rawStreams) ack(ctx context.Context, id, _ string) error {
	return r.rdb.XAck(ctx, r.key, "g", id).Err()
}

type projectQueue struct {
	q          *project.Queue
	k          project.Keys
	pid        string
	topic, sub string
	payload    []byte
	run        string
}

func (p projectQueue) publish(ctx context.Context, i int) error {
	_, _, err := p.q.Publish(ctx, p.k, p.pid, p.topic, project.PublishInput{ProducerID: "producer", ClientEventID: p.run + strconv.Itoa(i), Payload: p.payload})
	return err
}

func (p projectQueue) claim(ctx context.Context, _, n int) ([][2]string, error) {
	items, err := p.q.Claim(ctx, p.k, p.sub, n, false)
	if err != nil {
		return nil, err
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		out[i] = [2]string{it.Message.ID, it.Token}
	}
	return out, nil
}

func (p projectQueue) ack(ctx context.Context, id, token string) error {
	_, _, err := p.q.Ack(ctx, p.k, p.sub, id, token, "processed", "")
	return err
}
