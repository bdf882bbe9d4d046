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
// each queue script (usec_per_call and the main thread's user CPU), one call
// at a time on the package's redis-server, in phases: b.N publishes to a
// topic with one subscription, claims of 10, b.N acks, b.N publishes again,
// claims of 1, b.N acks, b.N claims that find nothing, b.N module budget
// lease renewals (return the last lease, take the next). The scripts are
// called directly (no module budget lease, no batching), so each phase's
// figure is that script alone (claim10 and claim1 per call, not per
// message; claim0 finds nothing). ns/op is the client's time for all
// phases per message and means little; the per-script metrics are the
// point.
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

	// phase runs f n times and records two figures per call under name:
	// usec_per_call of EVALSHA (INFO commandstats: the time the script
	// ran, without reading the request and writing the reply) and the user
	// CPU time of Redis's main thread (INFO cpu: the script's own work plus
	// request parsing and reply encoding). On a loaded machine the first
	// also counts the time Redis waited for a core mid-script; the second
	// does not, and leaves out the system time, which is mostly the
	// network and the same for every script. Rounds of one script add up.
	usec, cpu := map[string]float64{}, map[string]float64{}
	phase := func(name string, n int, f func(i int)) {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		before := redisCPUSeconds(b, admin, "used_cpu_user_main_thread")
		for i := range n {
			f(i)
		}
		cpu[name] += (redisCPUSeconds(b, admin, "used_cpu_user_main_thread") - before) * 1e6 / float64(n)
		usec[name] += evalshaUsecPerCall(b, admin)
	}
	b.ResetTimer()
	held := make([][2]string, 0, b.N)
	for round, count := range []int{10, 1} {
		phase("publish", b.N, func(i int) { s.publish(ctx, b, round*b.N+i) })
		held = held[:0]
		phase("claim"+strconv.Itoa(count), (b.N+count-1)/count, func(int) { held = append(held, s.claim(ctx, b, count)...) })
		if len(held) != b.N {
			b.Fatalf("claimed %d of %d", len(held), b.N)
		}
		phase("ack", b.N, func(i int) { s.ack(ctx, b, held[i]) })
	}
	phase("claim0", b.N, func(int) {
		if got := s.claim(ctx, b, 10); len(got) != 0 {
			b.Fatalf("claimed %d from an empty queue", len(got))
		}
	})
	// Module budget leases: each call returns the previous lease (with
	// the bytes its publishes kept) and takes the next, as a renewal does.
	mk := project.NewModuleKeys("scr" + ids.New()[24:])
	defer admin.Del(ctx, mk.Budget(), mk.Reservations(), mk.Leases(), mk.Projects(), mk.Seen())
	prev := ""
	phase("lease", b.N, func(i int) {
		id := "l" + strconv.Itoa(i)
		kept := 0
		if prev != "" {
			kept = 40000
		}
		err := lua.ProjectTopicBudgetLease.Run(ctx, rdb, []string{mk.Budget(), mk.Reservations(), mk.Leases(), mk.Projects(), mk.Seen()},
			prev, kept, 0, 0, id, project.ModuleLeaseMaxBytes, 10000, int64(1<<40), int64(1<<36), 0, pid).Err()
		if err != nil {
			b.Fatal(err)
		}
		prev = id
	})
	b.StopTimer()
	for name, rounds := range map[string]float64{"publish": 2, "ack": 2, "claim10": 1, "claim1": 1, "claim0": 1, "lease": 1} {
		b.ReportMetric(usec[name]/rounds, name+"-usec/call")
		b.ReportMetric(cpu[name]/rounds, name+"-cpu-µs/call")
	}
}

// evalshaUsecPerCall reads usec_per_call of EVALSHA from INFO commandstats.
func evalshaUsecPerCall(b *testing.B, admin *redis.Client) float64 {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
		}
	}
	b.Fatal("no EVALSHA in INFO commandstats")
	return 0
}

// redisCPUSeconds is the sum of the named INFO cpu fields (seconds).
func redisCPUSeconds(b *testing.B, admin *redis.Client, fields ...string) float64 {
	info, err := admin.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	total, found := 0.0, 0
	for line := range strings.SplitSeq(info, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		for _, f := range fields {
			if name != f {
				continue
			}
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += n
			found++
		}
	}
	if found != len(fields) {
		b.Fatalf("INFO cpu lacks one of %v", fields)
	}
	return total
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
		s.tid, int64(1<<40), project.ReceiptReserveBytes, 60000, 16, 1, s.sid,
		identity, project.Fingerprint([]byte(s.payload)), "producer", ev, s.payload, len(s.payload), dd, need).Slice()
	if err != nil || res[0].([]any)[0] != "created" {
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
		s.sid, s.tid, 30000, project.ReceiptMaxAttempts, 0, 16, count, strings.Join(hashes, "")).Slice()
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
	if err != nil || res[0].([]any)[0] != "ok" {
		b.Fatal(res, err)
	}
}
