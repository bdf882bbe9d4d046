package project_test

import (
	"context"
	"strings"
	"testing"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/project"
)

// One publish script call with many messages handles them in order, as
// separate calls would: the same identity again is a replay of the message
// created earlier in the call (its id), with another payload a conflict; a
// message its module reservation does not cover is refused alone; the
// counters, receipts and dedupe records hold exactly the messages created.
func TestMergedPublishHandlesItemsInOrder(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	ctx := context.Background()
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	k := tp.k
	keys := []string{k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(tp.tid), k.TopicSubscriptions(tp.tid),
		k.TopicOpen(tp.tid), k.TopicDone(tp.tid), k.Receipts(tp.sid)}
	args := []any{tp.tid, int64(1 << 30), project.ReceiptReserveBytes, 60000, 16, 1, tp.sid}
	item := func(ev, payload string, reserve bool) []any {
		dd := project.DedupeRecordBytes(tp.tid, "p", ev)
		need := int64(len(payload)) + dd + project.ReceiptReserveBytes
		if !reserve {
			need = 0
		}
		return []any{tp.tid + "\np\n" + ev, project.Fingerprint([]byte(payload)), "p", ev, payload, len(payload), dd, need}
	}
	for _, it := range [][]any{item("x", `{"a":1}`, true), item("y", `{"b":2}`, true), item("x", `{"a":1}`, true),
		item("x", `{"a":2}`, true), item("z", `{"c":3}`, false)} {
		args = append(args, it...)
	}
	res, err := lua.ProjectTopicPublish.Run(ctx, e.rdb, keys, args...).Slice()
	if err != nil || len(res) != 5 {
		t.Fatal(res, err)
	}
	row := func(i int) []any { r, _ := res[i].([]any); return r }
	want := []string{"created", "created", "replay", "conflict", "module"}
	for i, w := range want {
		if row(i)[0] != w {
			t.Fatalf("item %d: %v, want %s", i, row(i), w)
		}
	}
	if row(2)[1] != row(0)[1] || row(0)[1] == row(1)[1] {
		t.Fatalf("replay %v of %v", row(2), row(0))
	}
	if n := e.admin.XLen(ctx, k.TopicStream(tp.tid)).Val(); n != 2 {
		t.Fatalf("stream holds %d messages", n)
	}
	ddBytes := project.DedupeRecordBytes(tp.tid, "p", "x") + project.DedupeRecordBytes(tp.tid, "p", "y")
	wantBudget := map[string]int64{"msg": 14, "rcpt": 2 * project.ReceiptReserveBytes, "dd": ddBytes, "tb:" + tp.tid: 14}
	for f, w := range wantBudget {
		if got, _ := e.admin.HGet(ctx, k.Budget(), f).Int64(); got != w {
			t.Errorf("budget %s = %d, want %d", f, got, w)
		}
	}
	if added := row(0)[3].(int64) + row(1)[3].(int64); added != 14+ddBytes+2*project.ReceiptReserveBytes {
		t.Errorf("added %d", added)
	}
	for _, key := range []string{k.Receipts(tp.sid), k.TopicOpen(tp.tid), k.Dedupe()} {
		if n := e.admin.HLen(ctx, key).Val(); n != 2 {
			t.Errorf("%s holds %d fields", key, n)
		}
	}
	if n := e.admin.ZCard(ctx, k.DedupeExpiry()).Val(); n != 2 {
		t.Errorf("dedupe expiry holds %d", n)
	}
	// The stored message is found again by a later call.
	m, replay, err := q.Publish(ctx, k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p", ClientEventID: "y", Payload: []byte(`{"b":2}`)})
	if err != nil || !replay || m.ID != row(1)[1] {
		t.Fatal(m, replay, err)
	}
}

// Claims merged into one script call take the messages in order, each up
// to its own count with its own token hashes; acks merged into one call are
// handled in order: the same ack twice is applied once and then replayed,
// a foreign token is refused alone, and the terminal messages leave the
// open counts and the leases for the done index.
func TestMergedClaimsAndAcksHandleItemsInOrder(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	ctx := context.Background()
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	k := tp.k
	for _, ev := range []string{"1", "2", "3", "4", "5"} {
		if err := publishOne(q, tp, ev); err != nil {
			t.Fatal(err)
		}
	}
	hashes := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = project.LeaseTokenHash(prefix + string(rune('a'+i)))
		}
		return out
	}
	h1, h2, h3 := hashes("one", 2), hashes("two", 10), hashes("three", 1)
	res, err := lua.ProjectTopicClaim.Run(ctx, e.rdb, []string{k.Topics(), k.Subscriptions(), k.TopicStream(tp.tid), k.TopicOpen(tp.tid),
		k.TopicDone(tp.tid), k.Receipts(tp.sid), k.Leases(tp.sid)}, tp.sid, tp.tid, 30000, project.ReceiptMaxAttempts, 0, 16,
		2, strings.Join(h1, ""), 10, strings.Join(h2, ""), 1, strings.Join(h3, "")).Slice()
	if err != nil || len(res) != 5 || res[0] != "ok" {
		t.Fatal(res, err)
	}
	type held struct{ id, hash string }
	var got [3][]held
	for c, hs := range [][]string{h1, h2, h3} {
		items, _ := res[2+c].([]any)
		for _, it := range items {
			f := it.([]any)
			got[c] = append(got[c], held{f[0].(string), hs[f[8].(int64)-1]})
		}
	}
	if len(got[0]) != 2 || len(got[1]) != 3 || len(got[2]) != 0 {
		t.Fatalf("claims took %d, %d, %d", len(got[0]), len(got[1]), len(got[2]))
	}
	all := append(append([]held{}, got[0]...), got[1]...)
	for i := 1; i < len(all); i++ {
		if !streamIDLess(all[i-1].id, all[i].id) {
			t.Fatalf("out of order: %v", all)
		}
	}
	if n := e.admin.ZCard(ctx, k.Leases(tp.sid)).Val(); n != 5 {
		t.Fatalf("%d leases", n)
	}

	a, b, c := all[0], all[1], all[2]
	acks, err := lua.ProjectTopicAck.Run(ctx, e.rdb, []string{k.Subscriptions(), k.TopicOpen(tp.tid), k.TopicDone(tp.tid),
		k.Receipts(tp.sid), k.Leases(tp.sid)}, tp.sid, tp.tid,
		a.id, a.hash, "processed", "",
		a.id, a.hash, "processed", "",
		b.id, h3[0], "processed", "",
		c.id, c.hash, "failed", "boom",
		a.id, a.hash, "failed", "").Slice()
	if err != nil || len(acks) != 5 {
		t.Fatal(acks, err)
	}
	row := func(i int) []any { r, _ := acks[i].([]any); return r }
	for i, w := range []string{"ok", "ok", "lease_token_mismatch", "ok", "receipt_conflict"} {
		if row(i)[0] != w {
			t.Fatalf("ack %d: %v, want %s", i, row(i), w)
		}
	}
	if row(0)[2] != int64(1) || row(1)[2] != int64(0) || row(1)[1] != row(0)[1] || row(3)[2] != int64(1) {
		t.Fatalf("applied flags: %v %v %v", row(0), row(1), row(3))
	}
	if !strings.Contains(row(3)[1].(string), `"r":"boom"`) {
		t.Fatalf("failed receipt %v", row(3)[1])
	}
	leases := e.admin.ZRange(ctx, k.Leases(tp.sid), 0, -1).Val()
	done := e.admin.ZRange(ctx, k.TopicDone(tp.tid), 0, -1).Val()
	if len(leases) != 3 || len(done) != 2 || e.admin.HExists(ctx, k.TopicOpen(tp.tid), a.id).Val() ||
		e.admin.HExists(ctx, k.TopicOpen(tp.tid), c.id).Val() || !e.admin.HExists(ctx, k.TopicOpen(tp.tid), b.id).Val() {
		t.Fatalf("leases %v, done %v", leases, done)
	}
	if r := e.admin.HGet(ctx, k.Receipts(tp.sid), b.id).Val(); !strings.HasPrefix(r, `{"s":"leased"`) {
		t.Fatalf("receipt of the refused ack: %s", r)
	}
}

// streamIDLess compares two stream ids "<ms>-<seq>".
func streamIDLess(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	if len(am) != len(bm) {
		return len(am) < len(bm)
	}
	if am != bm {
		return am < bm
	}
	if len(as) != len(bs) {
		return len(as) < len(bs)
	}
	return as < bs
}
