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
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/project"
)

// A trim's releasedBytes are the message and receipt bytes of the messages
// it removed. The expired dedupe records it purges on the way belong to
// any topic of the project and are not the trim's doing: they leave the
// project and module budgets, but a trim of an empty topic used to report
// them as released. The module counter stays exact throughout.
func TestTrimReleasesOnlyTheTrimmedBytes(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	// Exact reservations: the module counter follows every settle.
	q := e.queue(project.QueueConfig{DedupeWindow: time.Millisecond, ModuleLeaseBytes: -1})
	tp := e.topic(q)
	ctx := context.Background()
	lonely, err := q.CreateTopic(ctx, tp.k, ids.New(), "lonely", "")
	if err != nil {
		t.Fatal(err)
	}
	empty, err := q.CreateTopic(ctx, tp.k, ids.New(), "empty", "")
	if err != nil {
		t.Fatal(err)
	}
	// One message held by tp's subscription, one on a topic without
	// subscriptions (terminal at once); their dedupe records then expire.
	if err := publishOne(q, tp, "held"); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(q, leaseTopic{k: tp.k, pid: tp.pid, tid: lonely.ID}, "lonely"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)

	res, err := q.Trim(ctx, tp.k, tp.pid, empty.ID)
	if err != nil || res.Trimmed != 0 || res.ReleasedBytes != 0 {
		t.Fatalf("trim of an empty topic: %+v %v; want nothing trimmed and nothing released", res, err)
	}
	const payloadBytes = 211 // publishOne's payload
	msgBytes := payloadBytes + int64(len("p")+len("lonely")) + project.MessageOverheadBytes
	res, err = q.Trim(ctx, tp.k, tp.pid, lonely.ID)
	if err != nil || res.Trimmed != 1 || res.ReleasedBytes != msgBytes {
		t.Fatalf("trim of one message without receipts: %+v %v; want 1 trimmed, its %d bytes released", res, err, msgBytes)
	}
	dd := e.admin.HGet(ctx, tp.k.Budget(), "dd").Val()
	committed, reserved, _, _, _ := e.module()
	if held := e.projectBytes(tp); dd != "0" || committed != held || reserved != 0 {
		t.Fatalf("after the trims: dedupe bytes %q, module committed %d reserved %d; want no dedupe bytes and the project's %d committed",
			dd, committed, reserved, held)
	}
}

// An ack repeated with the acknowledging token and the same status and
// result answers the same receipt again, but only until the message is
// trimmed: trim deletes the receipt with the message, and the repeat then
// answers message not found (for a consumer that already processed the
// message, a benign answer).
func TestAckReplayAnswersUntilTheMessageIsTrimmed(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	if err := publishOne(q, tp, "m"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	items, err := q.Claim(ctx, tp.k, tp.sid, 1, false)
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v %v", items, err)
	}
	it := items[0]
	first, applied, err := q.Ack(ctx, tp.k, tp.sid, it.Message.ID, it.Token, "processed", "ok")
	if err != nil || !applied {
		t.Fatalf("ack: %+v %v %v", first, applied, err)
	}
	again, applied, err := q.Ack(ctx, tp.k, tp.sid, it.Message.ID, it.Token, "processed", "ok")
	if err != nil || applied || again.Status != first.Status || again.UpdatedAt != first.UpdatedAt {
		t.Fatalf("repeated ack before the trim: %+v applied=%v %v; want the same receipt %+v", again, applied, err, first)
	}
	if res, err := q.Trim(ctx, tp.k, tp.pid, tp.tid); err != nil || res.Trimmed != 1 {
		t.Fatalf("trim: %+v %v", res, err)
	}
	if _, _, err := q.Ack(ctx, tp.k, tp.sid, it.Message.ID, it.Token, "processed", "ok"); !errors.Is(err, project.ErrMessageNotFound) {
		t.Fatalf("repeated ack after the trim: %v, want message not found", err)
	}
}

// trimProbe measures every run of the trim script sent through the client
// it hooks: the Redis commands it ran (INFO commandstats counts a script's
// own commands under their names; nothing else runs meanwhile) and the
// messages it removed. An EVALSHA refused with NOSCRIPT ran nothing.
type trimProbe struct {
	admin *redis.Client
	runs  []trimRun
	err   error
}

type trimRun struct {
	subscriptions int
	commands      int64 // the EVALSHA and the commands the script ran
	trimmed       int64
}

// redisCalls is every command Redis counted but its INFO calls.
func redisCalls(admin *redis.Client) (int64, error) {
	s, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	for line := range strings.Lines(s) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

func (p *trimProbe) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *trimProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p *trimProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 3 || !(a[0] == "evalsha" && a[1] == lua.ProjectTopicTrim.Hash() || a[0] == "eval" && a[1] == lua.ProjectTopicTrim.Source) {
			return next(ctx, cmd)
		}
		before, err1 := redisCalls(p.admin)
		err := next(ctx, cmd)
		after, err2 := redisCalls(p.admin)
		if lua.IsNoScript(err) {
			return err // Run sends it again as EVAL
		}
		res, err3 := lua.Reply(cmd).Slice()
		keys, _ := a[2].(int)
		if e := errors.Join(err1, err2, err3); e != nil && p.err == nil {
			p.err = e
		}
		if len(res) > 1 {
			n, _ := res[1].(int64)
			p.runs = append(p.runs, trimRun{subscriptions: (keys - 8) / 2, commands: after - before, trimmed: n})
		}
		return err
	}
}

// A trim holds Redis for one batch at a time, and a batch's work is
// bounded whatever the topic's subscription count: a project with the
// most subscriptions allowed, on messages published before they existed
// (no receipts, so little budget), used to make one batch look up and
// delete 256 messages x 256 subscriptions receipts one command each, a
// script of ~131,000 commands blocking every client of the server. The
// trim still removes every terminal message with its receipts and
// releases exactly their bytes.
func TestTrimBatchWorkIsBoundedWithManySubscriptions(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	probe := &trimProbe{admin: e.admin}
	e.rdb.AddHook(probe)
	q := e.queue(project.QueueConfig{ModuleLeaseBytes: -1})
	ctx := context.Background()
	pid := ids.New()
	k := project.NewKeys(e.env, pid)
	top, err := q.CreateTopic(ctx, k, ids.New(), "t", "")
	if err != nil {
		t.Fatal(err)
	}
	tp := leaseTopic{k: k, pid: pid, tid: top.ID}
	// 256 messages published before any subscription: no receipts.
	const bare = 256
	for i := range bare {
		if err := publishOne(q, tp, fmt.Sprint("bare", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Three more with receipts in the first subscription, processed.
	sub, err := q.CreateSubscription(ctx, k, ids.New(), top.ID, "s0")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := publishOne(q, tp, fmt.Sprint("acked", i)); err != nil {
			t.Fatal(err)
		}
	}
	items, err := q.Claim(ctx, k, sub.ID, 3, false)
	if err != nil || len(items) != 3 {
		t.Fatalf("claim: %d items, %v", len(items), err)
	}
	for _, it := range items {
		if _, _, err := q.Ack(ctx, k, sub.ID, it.Message.ID, it.Token, "processed", ""); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < project.MaxSubscriptionsDefault; i++ {
		if _, err := q.CreateSubscription(ctx, k, ids.New(), top.ID, fmt.Sprint("s", i)); err != nil {
			t.Fatal(err)
		}
	}
	held := e.admin.HGet(ctx, k.Budget(), "msg").Val()

	res, err := q.Trim(ctx, k, pid, top.ID)
	if err != nil || probe.err != nil {
		t.Fatal(err, probe.err)
	}
	if res.Trimmed != bare+3 || strconv.FormatInt(res.ReleasedBytes-3*project.ReceiptReserveBytes, 10) != held {
		t.Fatalf("trim: %+v; want %d messages and their %s message bytes + 3 receipts released", res, bare+3, held)
	}
	b := e.admin.HMGet(ctx, k.Budget(), "msg", "rcpt", "tb:"+top.ID).Val()
	if b[0] != "0" || b[1] != "0" || b[2] != "0" || e.admin.HLen(ctx, k.Receipts(sub.ID)).Val() != 0 ||
		e.admin.XLen(ctx, k.TopicStream(top.ID)).Val() != 0 {
		t.Fatalf("after the trim: budget %v, %d receipts, %d messages left; want nothing",
			b, e.admin.HLen(ctx, k.Receipts(sub.ID)).Val(), e.admin.XLen(ctx, k.TopicStream(top.ID)).Val())
	}
	// Each run looks up at most 4,096 receipts (messages x subscriptions)
	// and runs a few commands per subscription and per message: key type
	// checks, the lease scan, one read and one delete of the batch's
	// receipts, the message reads.
	var trimmed, most int64
	for i, r := range probe.runs {
		most = max(most, r.commands)
		trimmed += r.trimmed
		if r.subscriptions != project.MaxSubscriptionsDefault || r.trimmed*int64(r.subscriptions) > 4096 || r.commands > 2048 {
			t.Fatalf("trim run %d of %d: %+v; want at most 4096 receipt lookups and 2048 commands", i, len(probe.runs), r)
		}
	}
	if trimmed != res.Trimmed {
		t.Fatalf("the runs measured trimmed %d, the trim %d", trimmed, res.Trimmed)
	}
	t.Logf("%d runs, at most %d commands each", len(probe.runs), most)
}
