package project_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// BenchmarkProjectQueueScripts measures what Redis spends on one call of
// each queue script (user CPU time of its main thread, INFO cpu), one call
// at a time on the package's redis-server, in phases: b.N publishes to a
// topic with one subscription, claims of 10, b.N acks, b.N publishes again,
// claims of 1, b.N acks, b.N claims that find nothing. The scripts are
// called directly (no module budget lease, no batching), so each phase's
// figure is that script alone. ns/op is the client's time for all phases
// per message and means little; the per-script metrics are the point.
//
//	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -bench BenchmarkProjectQueueScripts -benchtime 5000x ./store/project/
func BenchmarkProjectQueueScripts(b *testing.B) {
	ctx := context.Background()
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{PoolSize: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	admin := env.Redis.AdminClient(0)
	defer admin.Close()

	pid := ids.New()
	k := project.NewKeys("scr"+ids.New()[24:], pid)
	q := project.NewQueue(rdb, project.NewModuleBudget(rdb, "scr"+ids.New()[24:], 1<<40), project.QueueConfig{ProjectBudgetBytes: 1 << 40})
	top, err := q.CreateTopic(ctx, k, ids.New(), "bench", "")
	if err != nil {
		b.Fatal(err)
	}
	sub, err := q.CreateSubscription(ctx, k, ids.New(), top.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer q.DeleteTopic(ctx, k, pid, top.ID)
	s := scriptCalls{rdb: rdb, k: k, tid: top.ID, sid: sub.ID, run: ids.New(),
		payload: `{"body":"hello, this is a benchmark message of about one hundred bytes......","n":1}`}

	// phase runs f n times and returns the user CPU time of Redis's main
	// thread per call (INFO cpu), in µs: on a loaded machine a script's
	// usec_per_call (wall time) also counts the time Redis waited for a
	// core, and the system time is mostly the network, the same for every
	// script; user time is the scripts' own work plus the request parsing
	// and reply encoding.
	phase := func(n int, f func(i int)) float64 {
		before := mainThreadUserCPU(b, admin)
		for i := range n {
			f(i)
		}
		return (mainThreadUserCPU(b, admin) - before) * 1e6 / float64(n)
	}
	b.ResetTimer()
	var pub, claim10, claim1, ack, empty float64
	held := make([][2]string, 0, b.N)
	for round, count := range []int{10, 1} {
		pub += phase(b.N, func(i int) { s.publish(ctx, b, round*b.N+i) }) / 2
		held = held[:0]
		usec := phase((b.N+count-1)/count, func(int) { held = append(held, s.claim(ctx, b, count)...) })
		if count == 10 {
			claim10 = usec
		} else {
			claim1 = usec
		}
		if len(held) != b.N {
			b.Fatalf("claimed %d of %d", len(held), b.N)
		}
		ack += phase(b.N, func(i int) { s.ack(ctx, b, held[i]) }) / 2
	}
	empty = phase(b.N, func(int) {
		if got := s.claim(ctx, b, 10); len(got) != 0 {
			b.Fatalf("claimed %d from an empty queue", len(got))
		}
	})
	b.StopTimer()
	b.ReportMetric(pub, "publish-µs/call")
	b.ReportMetric(claim1, "claim1-µs/call")
	b.ReportMetric(claim10, "claim10-µs/call")
	b.ReportMetric(ack, "ack-µs/call")
	b.ReportMetric(empty, "claim0-µs/call")
}

// mainThreadUserCPU is the user CPU time (seconds) of Redis's main thread
// from INFO cpu.
func mainThreadUserCPU(b *testing.B, admin *redis.Client) float64 {
	info, err := admin.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_cpu_user_main_thread:"); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no used_cpu_user_main_thread in INFO cpu")
	return 0
}

// scriptCalls calls the queue's scripts directly, as Publish, Claim and Ack
// call them.
type scriptCalls struct {
	rdb           redis.UniversalClient
	k             project.Keys
	tid, sid, run string
	payload       string
}

func (s scriptCalls) publish(ctx context.Context, b *testing.B, i int) {
	ev := s.run + strconv.Itoa(i)
	identity := s.tid + "\nproducer\n" + ev
	dd := project.DedupeRecordBytes(s.tid, "producer", ev)
	need := int64(len(s.payload)) + dd + project.ReceiptReserveBytes
	res, err := lua.ProjectTopicPublish.Run(ctx, s.rdb, []string{s.k.Topics(), s.k.Budget(), s.k.Dedupe(), s.k.DedupeExpiry(),
		s.k.TopicStream(s.tid), s.k.TopicSubscriptions(s.tid), s.k.TopicOpen(s.tid), s.k.TopicDone(s.tid), s.k.Receipts(s.sid)},
		s.tid, identity, project.Fingerprint([]byte(s.payload)), "producer", ev, s.payload, len(s.payload), dd, need,
		int64(1<<40), project.ReceiptReserveBytes, 60000, 16, 1, s.sid).Slice()
	if err != nil || res[0] != "created" {
		b.Fatal(res, err)
	}
}

// claim leases up to count messages and returns {message id, token hash}.
func (s scriptCalls) claim(ctx context.Context, b *testing.B, count int) [][2]string {
	hashes := make([]string, count)
	for i := range hashes {
		hashes[i] = project.LeaseTokenHash(ids.New())
	}
	res, err := lua.ProjectTopicClaim.Run(ctx, s.rdb, []string{s.k.Topics(), s.k.Subscriptions(), s.k.TopicStream(s.tid),
		s.k.TopicOpen(s.tid), s.k.TopicDone(s.tid), s.k.Receipts(s.sid), s.k.Leases(s.sid)},
		s.sid, s.tid, count, 30000, project.ReceiptMaxAttempts, 0, 16, strings.Join(hashes, "")).Slice()
	if err != nil || res[0] != "ok" {
		b.Fatal(res, err)
	}
	items := res[2].([]any)
	out := make([][2]string, len(items))
	for i, it := range items {
		f := it.([]any)
		out[i] = [2]string{f[0].(string), hashes[f[8].(int64)-1]}
	}
	return out
}

func (s scriptCalls) ack(ctx context.Context, b *testing.B, held [2]string) {
	res, err := lua.ProjectTopicAck.Run(ctx, s.rdb, []string{s.k.Subscriptions(), s.k.TopicOpen(s.tid), s.k.TopicDone(s.tid),
		s.k.Receipts(s.sid), s.k.Leases(s.sid)}, s.sid, s.tid, held[0], held[1], "processed", "").Slice()
	if err != nil || res[0] != "ok" {
		b.Fatal(res, err)
	}
}
