package project_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
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
	res, err = q.Trim(ctx, tp.k, tp.pid, lonely.ID)
	if err != nil || res.Trimmed != 1 || res.ReleasedBytes != payloadBytes {
		t.Fatalf("trim of one message without receipts: %+v %v; want 1 trimmed, its %d bytes released", res, err, payloadBytes)
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
