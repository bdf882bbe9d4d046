package restapi_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

// receiptBytes is what every receipt reserves of the budget.
const receiptBytes = project.ReceiptReserveBytes

func ddBytes(topicID, producer, event string) int64 {
	return project.DedupeRecordBytes(topicID, producer, event)
}

// cost is what a published message holds of the budget until trim.
func cost(m msgResp) int64 {
	return m.SizeBytes + int64(len(m.ProducerID)+len(m.ClientEventID)) + project.MessageOverheadBytes
}

// Trim removes only messages terminal for every subscription (and those
// published while the topic had none), and the snapshot shows the release;
// the dedupe records stay counted; a retry after trim replays the stored
// message.
func TestQueueTrim(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "t")
	lonely := h.qPublish(p, top.ID, "lonely", `{"n":0}`) // no subscription yet: terminal
	a, b := h.qSub(p, top.ID, "a"), h.qSub(p, top.ID, "b")
	m1 := h.qPublish(p, top.ID, "m1", `{"n":1}`)
	m2 := h.qPublish(p, top.ID, "m2", `{"n":2}`)
	m3 := h.qPublish(p, top.ID, "m3", `{"n":3}`)
	dd := ddBytes(top.ID, "producer-1", "lonely") + ddBytes(top.ID, "producer-1", "m1") +
		ddBytes(top.ID, "producer-1", "m2") + ddBytes(top.ID, "producer-1", "m3")
	msgBytes := cost(lonely) + cost(m1) + cost(m2) + cost(m3)
	s0 := h.qSnap(p).Budget
	if s0.MessageBytes != msgBytes || s0.ReceiptBytes != 6*receiptBytes || s0.DedupeBytes != dd ||
		s0.UsedBytes != msgBytes+6*receiptBytes+dd || s0.LimitBytes != 2<<20 {
		t.Fatalf("budget before: %+v (want msg %d, dd %d)", s0, msgBytes, dd)
	}
	ack := func(subID string, n int) {
		t.Helper()
		for _, it := range h.qClaim(p, subID, n) {
			if code, body := h.qAck(p, subID, it.Message.ID, it.Token, "processed", ""); code != 200 {
				t.Fatalf("ack: %d %s", code, body)
			}
		}
	}
	ack(a.ID, 2) // a: m1, m2 processed
	ack(b.ID, 1) // b: m1 processed; m2 leased, m3 pending below
	held := h.qClaim(p, b.ID, 1)[0]
	trim := func() (int64, int64) {
		t.Helper()
		code, body := h.do(p.write, "POST", p.path("/topics/"+top.ID+"/trim"), `{}`)
		if code != 200 {
			t.Fatalf("trim: %d %s", code, body)
		}
		r := decode[struct{ Trimmed, ReleasedBytes int64 }](t, body)
		return r.Trimmed, r.ReleasedBytes
	}
	if n, rel := trim(); n != 2 || rel != cost(lonely)+cost(m1)+2*receiptBytes {
		t.Fatalf("trim removed %d, released %d", n, rel)
	}
	s1 := h.qSnap(p).Budget
	if s1.UsedBytes != s0.UsedBytes-cost(lonely)-cost(m1)-2*receiptBytes || s1.DedupeBytes != dd {
		t.Fatalf("budget after trim: %+v", s1)
	}
	listed := func() []string {
		var ids []string
		code, body := h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages"), "")
		if code != 200 {
			t.Fatalf("messages: %d %s", code, body)
		}
		for _, m := range decode[listResp[msgResp]](t, body).Items {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got := listed(); fmt.Sprint(got) != fmt.Sprint([]string{m2.ID, m3.ID}) {
		t.Fatalf("messages after trim: %v", got)
	}
	if n, _ := trim(); n != 0 {
		t.Fatalf("second trim removed %d", n)
	}
	// A retry of a trimmed message answers the stored message.
	code, body := h.qPublishRaw(p, top.ID, "producer-1", "m1", `{ "n" : 1 }`)
	if code != 200 || fmt.Sprint(decode[msgResp](t, body)) != fmt.Sprint(m1) {
		t.Fatalf("retry after trim: %d %s (first %+v)", code, body, m1)
	}
	// b's lease on m2 completes: m2 is terminal for both.
	if code, body := h.qAck(p, b.ID, held.Message.ID, held.Token, "failed", "boom"); code != 200 {
		t.Fatalf("ack m2: %d %s", code, body)
	}
	if n, _ := trim(); n != 1 {
		t.Fatalf("trim after the last receipt of m2: %d", n)
	}
	if got := listed(); fmt.Sprint(got) != fmt.Sprint([]string{m3.ID}) {
		t.Fatalf("messages: %v", got)
	}
	if rs := h.qReceipts(p, a.ID, 10); len(rs) != 1 || rs[0].MessageID != m3.ID {
		t.Fatalf("receipts of a after trims: %+v", rs)
	}
	final := h.qSnap(p).Budget
	if final.UsedBytes != cost(m3)+2*receiptBytes+dd || final.DedupeBytes != dd {
		t.Fatalf("final budget: %+v", final)
	}
	code, body = h.do(p.write, "POST", p.path("/topics/"+top.ID+"/trim"), `[`)
	wantError(t, code, body, 400, "invalid_json")
}

// Publishing past the 2 MiB project budget is refused; trim gives the room
// back except what the dedupe records hold until they expire.
func TestQueueProjectBudget(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "big")
	sub := h.qSub(p, top.ID, "s")
	payload := `{"k":"` + strings.Repeat("x", 16384-8) + `"}`
	per := project.MessageBytes("producer-1", "e000", []byte(payload)) + receiptBytes
	var published []msgResp
	var dd int64
	for i := 0; ; i++ {
		if i > 200 {
			t.Fatal("the budget never ran out")
		}
		ev := fmt.Sprintf("e%03d", i)
		code, b := h.qPublishRaw(p, top.ID, "producer-1", ev, payload)
		if code == 409 {
			wantError(t, code, b, 409, "budget_exhausted")
			break
		}
		if code != 201 {
			t.Fatalf("publish %d: %d %s", i, code, b)
		}
		published = append(published, decode[msgResp](t, b))
		dd += ddBytes(top.ID, "producer-1", ev)
	}
	s := h.qSnap(p).Budget
	n := int64(len(published))
	if s.UsedBytes != n*per+dd || s.UsedBytes > 2<<20 || s.UsedBytes+per+ddBytes(top.ID, "producer-1", "e999") <= 2<<20 {
		t.Fatalf("budget when full: %+v after %d messages", s, n)
	}
	// A smaller message that still fits is admitted; a replay needs no room.
	code, b := h.qPublishRaw(p, top.ID, "producer-1", "e000", payload)
	if code != 200 {
		t.Fatalf("replay when full: %d %s", code, b)
	}
	// Process everything and trim: messages and receipts are released, the
	// dedupe records stay.
	for range 20 {
		items := h.qClaim(p, sub.ID, 20)
		if len(items) == 0 {
			break
		}
		for _, it := range items {
			if code, b := h.qAck(p, sub.ID, it.Message.ID, it.Token, "processed", ""); code != 200 {
				t.Fatalf("ack: %d %s", code, b)
			}
		}
	}
	code, b = h.do(p.write, "POST", p.path("/topics/"+top.ID+"/trim"), `{}`)
	if code != 200 || decode[struct{ Trimmed int64 }](t, b).Trimmed != n {
		t.Fatalf("trim: %d %s", code, b)
	}
	s = h.qSnap(p).Budget
	if s.UsedBytes != dd || s.DedupeBytes != dd || s.MessageBytes != 0 || s.ReceiptBytes != 0 {
		t.Fatalf("after trim: %+v (dedupe %d)", s, dd)
	}
	if m := h.qPublish(p, top.ID, "after-trim", payload); m.ID == "" {
		t.Fatal("no publish after trim")
	}
}

// Dedupe records hold their bytes until they expire, even after the topic
// is gone; then they are no longer counted and the next budget-touching
// script purges them.
func TestQueueDedupeHeldUntilExpiry(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{DedupeWindow: 2 * time.Second}, nil)
	p := h.project()
	top := h.qTopic(p, "d")
	m := h.qPublish(p, top.ID, "x", `{}`)
	dd := ddBytes(top.ID, "producer-1", "x")
	if code, b := h.do(p.write, "DELETE", p.path("/topics/"+top.ID), ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	if s := h.qSnap(p).Budget; s.UsedBytes != dd || s.DedupeBytes != dd {
		t.Fatalf("after delete: %+v", s)
	}
	if n := h.admin.HLen(context.Background(), p.keys.Dedupe()).Val(); n != 1 {
		t.Fatalf("dedupe records: %d", n)
	}
	h.waitRedisPast(m.PublishedAt + 2000)
	if s := h.qSnap(p).Budget; s.UsedBytes != 0 || s.DedupeBytes != 0 {
		t.Fatalf("after expiry: %+v", s)
	}
	other := h.qTopic(p, "d2")
	h.qPublish(p, other.ID, "y", `{}`)
	if v, _ := h.admin.HExists(context.Background(), p.keys.Dedupe(), top.ID+"\nproducer-1\nx").Result(); v {
		t.Fatal("the expired record was not purged")
	}
	if s := h.qSnap(p).Budget; s.DedupeBytes != ddBytes(other.ID, "producer-1", "y") {
		t.Fatalf("budget: %+v", s)
	}
}

// Deleting a subscription or a topic leaves no key of it behind and
// releases its budget; the project's dedupe records stay; a retry to the
// deleted topic is 404.
func TestQueueDeletes(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	top := h.qTopic(p, "gone")
	a, b := h.qSub(p, top.ID, "a"), h.qSub(p, top.ID, "b")
	var msgs []msgResp
	for i := range 3 {
		msgs = append(msgs, h.qPublish(p, top.ID, fmt.Sprint(i), fmt.Sprintf(`{"i":%d}`, i)))
	}
	it := h.qClaim(p, a.ID, 1)[0]
	h.qAck(p, a.ID, it.Message.ID, it.Token, "processed", "")
	heldA := h.qClaim(p, a.ID, 1)[0] // a: processed, leased, pending
	h.qClaim(p, b.ID, 3)             // b: all leased
	if len(h.keysUnder(p.keys.SubscriptionPrefix(b.ID))) == 0 || len(h.keysUnder(p.keys.TopicPrefix(top.ID))) == 0 {
		t.Fatal("no keys to delete")
	}
	before := h.qSnap(p).Budget

	if code, body := h.do(p.write, "DELETE", p.path("/subscriptions/"+b.ID), ""); code != 204 {
		t.Fatalf("delete subscription: %d %s", code, body)
	}
	if keys := h.keysUnder(p.keys.SubscriptionPrefix(b.ID)); len(keys) != 0 {
		t.Fatalf("keys of the deleted subscription: %v", keys)
	}
	if h.admin.HExists(ctx, p.keys.Subscriptions(), b.ID).Val() || h.admin.SIsMember(ctx, p.keys.TopicSubscriptions(top.ID), b.ID).Val() {
		t.Fatal("the subscription is still registered")
	}
	if s := h.qSnap(p); s.Budget.UsedBytes != before.UsedBytes-3*receiptBytes || len(s.Subscriptions) != 1 {
		t.Fatalf("after subscription delete: %+v (before %+v)", s, before)
	}
	code, body := h.qClaimRaw(p.write, p, b.ID, 1)
	wantError(t, code, body, 404, "subscription_not_found")
	code, body = h.do(p.write, "DELETE", p.path("/subscriptions/"+b.ID), "")
	wantError(t, code, body, 404, "subscription_not_found")
	// The message a processed is terminal for every remaining subscription.
	if code, body := h.do(p.write, "POST", p.path("/topics/"+top.ID+"/trim"), `{}`); code != 200 ||
		decode[struct{ Trimmed int }](t, body).Trimmed != 1 {
		t.Fatalf("trim: %d %s", code, body)
	}

	dd := h.admin.HGetAll(ctx, p.keys.Dedupe()).Val()
	if code, body := h.do(p.write, "DELETE", p.path("/topics/"+top.ID), ""); code != 204 {
		t.Fatalf("delete topic: %d %s", code, body)
	}
	for _, prefix := range []string{p.keys.TopicPrefix(top.ID), p.keys.SubscriptionPrefix(a.ID)} {
		if keys := h.keysUnder(prefix); len(keys) != 0 {
			t.Fatalf("keys left: %v", keys)
		}
	}
	if h.admin.HLen(ctx, p.keys.Topics()).Val() != 0 || h.admin.HLen(ctx, p.keys.TopicNames()).Val() != 0 ||
		h.admin.HLen(ctx, p.keys.Subscriptions()).Val() != 0 {
		t.Fatal("the topic or its subscriptions are still registered")
	}
	if got := h.admin.HGetAll(ctx, p.keys.Dedupe()).Val(); fmt.Sprint(got) != fmt.Sprint(dd) || len(got) != 3 {
		t.Fatalf("dedupe records changed: %v → %v", dd, got)
	}
	var ddSum int64
	for i := range 3 {
		ddSum += ddBytes(top.ID, "producer-1", fmt.Sprint(i))
	}
	if s := h.qSnap(p); s.Budget.UsedBytes != ddSum || s.Budget.MessageBytes != 0 || s.Budget.ReceiptBytes != 0 ||
		len(s.Topics) != 0 || len(s.Subscriptions) != 0 {
		t.Fatalf("after topic delete: %+v", s)
	}
	// Retries to the deleted topic are 404, whatever their payload.
	code, body = h.qPublishRaw(p, top.ID, "producer-1", "0", `{"i":0}`)
	wantError(t, code, body, 404, "topic_not_found")
	code, body = h.qAck(p, a.ID, heldA.Message.ID, heldA.Token, "processed", "")
	wantError(t, code, body, 404, "subscription_not_found")
	for _, r := range []struct{ method, path, body string }{
		{"DELETE", "/topics/" + top.ID, ""}, {"POST", "/topics/" + top.ID + "/trim", "{}"},
		{"GET", "/topics/" + top.ID + "/messages", ""}, {"DELETE", "/topics/not-a-uuid", ""},
	} {
		code, body := h.do(p.write, r.method, p.path(r.path), r.body)
		wantError(t, code, body, 404, "topic_not_found")
	}
	// The name is free again.
	if again := h.qTopic(p, "gone"); again.ID == top.ID {
		t.Fatal("same id")
	}
	_ = msgs
}

// The module budget is shared by every project: one project filling it
// refuses another's publish although that project's own budget is empty;
// releases make room again.
func TestQueueModuleBudgetAcrossProjects(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	const module = 100_000
	h := newQueueHarness(t, project.QueueConfig{ModuleBudgetBytes: module}, rs)
	pa, pb := h.project(), h.project()
	ta, tb := h.qTopic(pa, "a"), h.qTopic(pb, "b")
	sa := h.qSub(pa, ta.ID, "s")
	payload := `{"k":"` + strings.Repeat("x", 4000) + `"}`
	n := 0
	for ; ; n++ {
		code, b := h.qPublishRaw(pa, ta.ID, "p", fmt.Sprint(n), payload)
		if code == 409 {
			wantError(t, code, b, 409, "budget_exhausted")
			break
		}
		if code != 201 || n > 50 {
			t.Fatalf("publish %d: %d %s", n, code, b)
		}
	}
	sA, sB := h.qSnap(pa).Budget, h.qSnap(pb).Budget
	if sA.UsedBytes > module || sA.UsedBytes >= sA.LimitBytes || sB.UsedBytes != 0 || sB.ModuleUsedBytes != sA.UsedBytes ||
		sB.ModuleLimitBytes != module {
		t.Fatalf("project a %+v, project b %+v", sA, sB)
	}
	code, b := h.qPublishRaw(pb, tb.ID, "p", "first", payload)
	wantError(t, code, b, 409, "budget_exhausted")
	// a processes and trims: b fits now.
	for _, it := range h.qClaim(pa, sa.ID, 20) {
		h.qAck(pa, sa.ID, it.Message.ID, it.Token, "processed", "")
	}
	if code, b := h.do(pa.write, "POST", pa.path("/topics/"+ta.ID+"/trim"), `{}`); code != 200 {
		t.Fatalf("trim: %d %s", code, b)
	}
	if code, b := h.qPublishRaw(pb, tb.ID, "p", "first", payload); code != 201 {
		t.Fatalf("b after a's trim: %d %s", code, b)
	}
	h.assertModuleMatches(rs, pa, pb)
}

// assertModuleMatches checks that the module counter equals the sum of the
// project budgets and that no reservation is left.
func (h *prjHarness) assertModuleMatches(rs *testenv.RedisServer, ps ...testProject) {
	h.t.Helper()
	ctx := context.Background()
	var sum int64
	for _, p := range ps {
		for _, f := range []string{"msg", "rcpt", "dd"} {
			v, _ := h.admin.HGet(ctx, p.keys.Budget(), f).Int64()
			sum += v
		}
	}
	mk := project.NewModuleKeys(prjEnv)
	committed, _ := h.admin.HGet(ctx, mk.Budget(), "committed").Int64()
	reserved, _ := h.admin.HGet(ctx, mk.Budget(), "reserved").Int64()
	if committed != sum || reserved != 0 || h.admin.HLen(ctx, mk.Reservations()).Val() != 0 {
		h.t.Fatalf("module committed %d reserved %d, projects sum %d", committed, reserved, sum)
	}
}

// Eight projects publish concurrently against a small module budget: the
// sum of the project budgets never passes it, and afterwards the module
// counter equals that sum. Then releases and publishes race a reconcile
// loop: the counter never drops below the sum (never over-admits), and a
// final reconcile makes it exact again.
func TestQueueModuleBudgetConcurrentProjects(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	const module = 256 << 10
	h := newQueueHarness(t, project.QueueConfig{ModuleBudgetBytes: module}, rs)
	ctx := context.Background()
	type proj struct {
		p   testProject
		top topicResp
		sub subResp
	}
	var ps []proj
	var tps []testProject
	for range 8 {
		p := h.project()
		top := h.qTopic(p, "t")
		ps = append(ps, proj{p, top, h.qSub(p, top.ID, "s")})
		tps = append(tps, p)
	}
	mk := project.NewModuleKeys(prjEnv)
	projectSum := func() int64 {
		var sum int64
		for _, x := range ps {
			for _, v := range h.admin.HMGet(ctx, x.p.keys.Budget(), "msg", "rcpt", "dd").Val() {
				if s, ok := v.(string); ok {
					var n int64
					fmt.Sscan(s, &n)
					sum += n
				}
			}
		}
		return sum
	}
	payload := `{"k":"` + strings.Repeat("y", 2000) + `"}`
	var stop atomic.Bool
	var maxSeen atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for !stop.Load() {
			if s := projectSum(); s > maxSeen.Load() {
				maxSeen.Store(s)
			}
		}
	})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for _, x := range ps {
		for w := range 3 {
			wg.Go(func() {
				for i := 0; i < 100; i++ {
					code, b := h.qPublishRaw(x.p, x.top.ID, fmt.Sprint("w", w), fmt.Sprint(i), payload)
					if code == 409 {
						return
					}
					if code != 201 {
						t.Errorf("publish: %d %s", code, b)
						return
					}
					admitted.Add(1)
				}
			})
		}
	}
	wg.Wait()
	stop.Store(true)
	sampler.Wait()
	sum := projectSum()
	if sum > module || maxSeen.Load() > module {
		t.Fatalf("module budget passed: sum %d, max seen %d, cap %d", sum, maxSeen.Load(), module)
	}
	if sum < module-16<<10 {
		t.Fatalf("the budget was not used up: %d of %d", sum, module)
	}
	h.assertModuleMatches(rs, tps...)
	t.Logf("phase 1: %d publishes admitted, %d bytes", admitted.Load(), sum)

	// Phase 2: trims and publishes race a reconcile loop.
	mb := project.NewModuleBudget(h.rdb, prjEnv, module)
	stop.Store(false)
	maxSeen.Store(0)
	sampler.Go(func() {
		for !stop.Load() {
			if s := projectSum(); s > maxSeen.Load() {
				maxSeen.Store(s)
			}
		}
	})
	var recon sync.WaitGroup
	var runs atomic.Int64
	recon.Go(func() {
		for !stop.Load() {
			if _, err := mb.Reconcile(ctx, time.Minute); err != nil {
				t.Errorf("reconcile: %v", err)
				return
			}
			runs.Add(1)
		}
	})
	for _, x := range ps {
		wg.Go(func() {
			for range 3 {
				for _, it := range h.qClaim(x.p, x.sub.ID, 20) {
					h.qAck(x.p, x.sub.ID, it.Message.ID, it.Token, "processed", "")
				}
				h.do(x.p.write, "POST", x.p.path("/topics/"+x.top.ID+"/trim"), `{}`)
				for i := range 5 {
					code, _ := h.qPublishRaw(x.p, x.top.ID, "again", fmt.Sprint(i, "-", time.Now().UnixNano()), payload)
					if code != 201 && code != 409 {
						t.Errorf("publish: %d", code)
					}
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	recon.Wait()
	sampler.Wait()
	sum = projectSum()
	committed, _ := h.admin.HGet(ctx, mk.Budget(), "committed").Int64()
	if sum > module || maxSeen.Load() > module || committed < sum {
		t.Fatalf("after phase 2: projects %d, module committed %d, cap %d", sum, committed, module)
	}
	if res, err := mb.Reconcile(ctx, time.Minute); err != nil || !res.Ran {
		t.Fatalf("final reconcile: %+v %v", res, err)
	}
	h.assertModuleMatches(rs, tps...)
	t.Logf("phase 2: %d reconciles", runs.Load())
}

// A reservation whose writer died (never settled) keeps its bytes counted,
// so nothing is over-admitted; the reconcile drops it once stale.
func TestQueueModuleBudgetReconcileDropsDeadReservations(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	const module = 50_000
	h := newQueueHarness(t, project.QueueConfig{ModuleBudgetBytes: module}, rs)
	p := h.project()
	top := h.qTopic(p, "t")
	h.qPublish(p, top.ID, "one", `{}`)
	mb := project.NewModuleBudget(h.rdb, prjEnv, module)
	ctx := context.Background()
	if _, ok, err := mb.Reserve(ctx, p.id, module-1000); err != nil || !ok {
		t.Fatalf("reserve: %v %v", ok, err)
	}
	code, b := h.qPublishRaw(p, top.ID, "producer-1", "two", `{"k":"`+strings.Repeat("z", 1000)+`"}`)
	wantError(t, code, b, 409, "budget_exhausted")
	// A young reservation survives a reconcile (its writer may be alive).
	if res, err := mb.Reconcile(ctx, time.Hour); err != nil || !res.Ran || res.DroppedReservations != 0 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	if u, _ := mb.Usage(ctx); u.Reserved != module-1000 {
		t.Fatalf("usage: %+v", u)
	}
	if res, err := mb.Reconcile(ctx, 0); err != nil || res.DroppedReservations != 1 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	h.assertModuleMatches(rs, p)
	if code, b := h.qPublishRaw(p, top.ID, "producer-1", "two", `{"k":"`+strings.Repeat("z", 1000)+`"}`); code != 201 {
		t.Fatalf("after reconcile: %d %s", code, b)
	}
	// Drift upward (a crash after the project script, before settling) is
	// corrected too.
	h.admin.HIncrBy(ctx, project.NewModuleKeys(prjEnv).Budget(), "committed", 777)
	if res, err := mb.Reconcile(ctx, time.Hour); err != nil || res.Before-res.After != 777 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	h.assertModuleMatches(rs, p)
}
