package project_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store/project"
)

// chargeTopic is a project with one topic and no subscription: its
// messages are terminal at once.
func chargeTopic(t *testing.T, q *project.Queue, e *leaseEnv) leaseTopic {
	t.Helper()
	pid := ids.New()
	k := project.NewKeys(e.env, pid)
	top, err := q.CreateTopic(context.Background(), k, ids.New(), "t", "")
	if err != nil {
		t.Fatal(err)
	}
	return leaseTopic{k: k, pid: pid, tid: top.ID}
}

// publishUntilExhausted publishes `{}` with a 250-byte producerId and a
// 256-byte clientEventId until the budget refuses, at most limit times,
// waiting `between` after each; it returns how many were published.
func publishUntilExhausted(t *testing.T, q *project.Queue, tp leaseTopic, limit int, between time.Duration) int {
	t.Helper()
	for i := range limit {
		_, _, err := q.Publish(context.Background(), tp.k, tp.pid, tp.tid, project.PublishInput{
			ProducerID: longProducer, ClientEventID: longEvent(i), Payload: []byte(`{}`)})
		if errors.Is(err, project.ErrBudgetExhausted) {
			return i
		}
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		time.Sleep(between)
	}
	t.Fatalf("%d publishes of `{}` with 500 bytes of identifiers each fit in the budget", limit)
	return limit
}

var longProducer = strings.Repeat("p", 250)

func longEvent(i int) string { return fmt.Sprintf("%s%06d", strings.Repeat("c", 250), i) }

// storedBytes is what Redis holds for the project's messages and dedupe
// records: the topic's stream and done ZSET, the dedupe HASH and its
// expiry ZSET.
func (e *leaseEnv) storedBytes(tp leaseTopic) int64 {
	ctx := context.Background()
	var sum int64
	for _, key := range []string{tp.k.TopicStream(tp.tid), tp.k.TopicDone(tp.tid), tp.k.Dedupe(), tp.k.DedupeExpiry()} {
		sum += e.admin.MemoryUsage(ctx, key, 0).Val()
	}
	return sum
}

// budgetFields reads the project budget's counters (missing is 0).
func (e *leaseEnv) budgetFields(tp leaseTopic) map[string]int64 {
	out := map[string]int64{}
	fields := []string{"msg", "rcpt", "dd", "tb:" + tp.tid}
	for i, v := range e.admin.HMGet(context.Background(), tp.k.Budget(), fields...).Val() {
		s, _ := v.(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		out[fields[i]] = n
	}
	return out
}

// A message costs the budget what its stream entry stores (payload,
// producerId, clientEventId and a fixed overhead), and a dedupe record
// what it stores (its identity twice and a fixed overhead). A `{}` message
// with 500 bytes of identifiers used to cost 2 bytes once its dedupe
// record expired: a project within its budget then held hundreds of times
// the budget in Redis. Now publishes stop at the count the charges give,
// what Redis holds stays near the budget, and trim and expiry bring the
// counters back to exactly zero.
func TestMessageChargeCoversWhatItStores(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	const budget = 256 << 10
	ctx := context.Background()
	msg := project.MessageBytes(longProducer, longEvent(0), []byte(`{}`))

	// Dedupe records live: each publish holds its message and its record.
	q := e.queue(project.QueueConfig{ProjectBudgetBytes: budget, ModuleLeaseBytes: -1})
	tp := chargeTopic(t, q, e)
	dd := project.DedupeRecordBytes(tp.tid, longProducer, longEvent(0))
	n := publishUntilExhausted(t, q, tp, 2000, 0)
	if want := budget / (msg + dd); int64(n) != want {
		t.Fatalf("%d publishes fit in %d bytes; want %d (%d per message + %d per dedupe record)", n, budget, want, msg, dd)
	}
	stored := e.storedBytes(tp)
	t.Logf("%d publishes: %d of %d bytes used, %d stored", n, e.projectBytes(tp), budget, stored)
	if stored > budget*5/4 {
		t.Fatalf("a project using %d of its %d bytes stores %d bytes of messages and dedupe records", e.projectBytes(tp), budget, stored)
	}

	// Dedupe records expire before the next publish: the messages alone
	// hold the budget.
	short := e.queue(project.QueueConfig{ProjectBudgetBytes: budget, ModuleLeaseBytes: -1, DedupeWindow: time.Millisecond})
	tp = chargeTopic(t, short, e)
	n = publishUntilExhausted(t, short, tp, 4000, 2*time.Millisecond)
	if want := (budget - dd) / msg; int64(n) != want {
		t.Fatalf("%d publishes fit in %d bytes with their dedupe records expired; want %d (%d per message)", n, budget, want, msg)
	}
	stored = e.storedBytes(tp)
	t.Logf("%d publishes: %d of %d bytes used, %d stored", n, e.projectBytes(tp), budget, stored)
	if stored > budget*5/4 {
		t.Fatalf("a project using %d of its %d bytes stores %d bytes of messages and dedupe records", e.projectBytes(tp), budget, stored)
	}

	// A message and a dedupe record stored as publishes wrote them before
	// messages were charged their identifiers: a message charged only its
	// payload bytes (z, no b) and a record of the old charge. Trim releases
	// what each was charged.
	if err := e.admin.XAdd(ctx, &redis.XAddArgs{Stream: tp.k.TopicStream(tp.tid),
		Values: []any{"p", "p", "c", "old", "d", `{"a":1}`, "z", "7", "a", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	oldID := e.admin.XRevRangeN(ctx, tp.k.TopicStream(tp.tid), "+", "-", 1).Val()[0].ID
	oldIdentity := tp.tid + "\np\nold"
	oldRecord := `{"m":"` + oldID + `","f":"` + strings.Repeat("0", 64) + `","a":1,"z":7,"b":162,"x":1}`
	pipe := e.admin.TxPipeline()
	pipe.ZAdd(ctx, tp.k.TopicDone(tp.tid), redis.Z{Score: 1, Member: oldID})
	pipe.HSet(ctx, tp.k.Dedupe(), oldIdentity, oldRecord)
	pipe.ZAdd(ctx, tp.k.DedupeExpiry(), redis.Z{Score: 1, Member: oldIdentity})
	pipe.HIncrBy(ctx, tp.k.Budget(), "msg", 7)
	pipe.HIncrBy(ctx, tp.k.Budget(), "tb:"+tp.tid, 7)
	pipe.HIncrBy(ctx, tp.k.Budget(), "dd", 162)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	before := e.budgetFields(tp)
	time.Sleep(2 * time.Millisecond)
	res, err := short.Trim(ctx, tp.k, tp.pid, tp.tid)
	if err != nil || res.Trimmed != int64(n)+1 || res.ReleasedBytes != int64(n)*msg+7 {
		t.Fatalf("trim: %+v %v; want %d messages and their %d bytes released", res, err, n+1, int64(n)*msg+7)
	}
	for f, v := range e.budgetFields(tp) {
		if v != 0 {
			t.Fatalf("after the trim and the dedupe records' expiry: %s = %d (was %v); want every counter 0", f, v, before)
		}
	}
}
