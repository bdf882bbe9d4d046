package project_test

import (
	"context"
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
