package restapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// qHarness serves the project API with a queue configuration of its own
// (short leases and dedupe windows, small budgets) on a redis-server.
type qHarness struct {
	*prjHarness
}

// newQueueHarness serves the project API with cfg on the package's
// redis-server (rs nil) or a private one.
func newQueueHarness(t *testing.T, cfg project.QueueConfig, rs *testenv.RedisServer) *qHarness {
	t.Helper()
	base := newHarness(t)
	rdb := base.rdb
	if rs == nil {
		rs = env.Redis
	} else {
		c, err := rds.NewRedis(rs.URL(0), rds.RedisConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		rdb = c
	}
	logs := &testenv.LogBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{
		Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789"), Env: prjEnv, EvictionPolicyTTL: time.Millisecond,
			ProjectQueue: cfg},
		Logger: logger, Store: base.store, Redis: rdb, Realtime: base.rt, Verifier: v})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	admin := rs.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	return &qHarness{&prjHarness{
		harness: &harness{t: t, srv: srv, api: api, pool: base.pool, rdb: rdb, rt: base.rt, store: base.store},
		admin:   admin, logs: logs,
	}}
}

type topicResp struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedAt   int64  `json:"createdAt"`
}

type subResp struct {
	ID        string `json:"id"`
	TopicID   string `json:"topicId"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	CreatedAt int64  `json:"createdAt"`
}

type msgResp struct {
	ID            string         `json:"id"`
	TopicID       string         `json:"topicId"`
	ProducerID    string         `json:"producerId"`
	ClientEventID string         `json:"clientEventId"`
	Payload       map[string]any `json:"payload"`
	SizeBytes     int64          `json:"sizeBytes"`
	PublishedAt   int64          `json:"publishedAt"`
}

type receiptResp struct {
	MessageID      string  `json:"messageId"`
	SubscriptionID string  `json:"subscriptionId"`
	Status         string  `json:"status"`
	Attempts       int     `json:"attempts"`
	LeaseUntil     *int64  `json:"leaseUntil"`
	Result         *string `json:"result"`
	UpdatedAt      int64   `json:"updatedAt"`
}

type claimResp struct {
	Message    msgResp     `json:"message"`
	Receipt    receiptResp `json:"receipt"`
	Token      string      `json:"token"`
	LeaseUntil int64       `json:"leaseUntil"`
}

type budgetResp struct {
	LimitBytes       int64 `json:"limitBytes"`
	UsedBytes        int64 `json:"usedBytes"`
	ModuleLimitBytes int64 `json:"moduleLimitBytes"`
	MessageBytes     int64 `json:"messageBytes"`
	ReceiptBytes     int64 `json:"receiptBytes"`
	DedupeBytes      int64 `json:"dedupeBytes"`
	ModuleUsedBytes  int64 `json:"moduleUsedBytes"`
}

type queueSnap struct {
	Topics        []topicResp `json:"topics"`
	Subscriptions []subResp   `json:"subscriptions"`
	Budget        budgetResp  `json:"budget"`
}

func (h *prjHarness) qTopic(p testProject, name string) topicResp {
	h.t.Helper()
	code, b := h.do(p.write, "POST", p.path("/topics"), fmt.Sprintf(`{"name":%q,"description":"d"}`, name))
	if code != 201 {
		h.t.Fatalf("POST /topics: %d %s", code, b)
	}
	return decode[topicResp](h.t, b)
}

func (h *prjHarness) qSub(p testProject, topicID, name string) subResp {
	h.t.Helper()
	code, b := h.do(p.write, "POST", p.path("/subscriptions"), fmt.Sprintf(`{"topicId":%q,"name":%q}`, topicID, name))
	if code != 201 {
		h.t.Fatalf("POST /subscriptions: %d %s", code, b)
	}
	return decode[subResp](h.t, b)
}

func (h *prjHarness) qPublishRaw(p testProject, topicID, producer, event, payload string) (int, []byte) {
	h.t.Helper()
	return h.do(p.write, "POST", p.path("/topics/"+topicID+"/messages"),
		fmt.Sprintf(`{"producerId":%q,"clientEventId":%q,"payload":%s}`, producer, event, payload))
}

// qPublish publishes and fails the test unless the answer is 201.
func (h *prjHarness) qPublish(p testProject, topicID, event, payload string) msgResp {
	h.t.Helper()
	code, b := h.qPublishRaw(p, topicID, "producer-1", event, payload)
	if code != 201 {
		h.t.Fatalf("publish %s: %d %s", event, code, b)
	}
	return decode[msgResp](h.t, b)
}

func (h *prjHarness) qClaimRaw(tok string, p testProject, subID string, count int) (int, []byte) {
	h.t.Helper()
	return h.do(tok, "POST", p.path("/subscriptions/"+subID+"/claim"), fmt.Sprintf(`{"count":%d}`, count))
}

func (h *prjHarness) qClaim(p testProject, subID string, count int) []claimResp {
	h.t.Helper()
	code, b := h.qClaimRaw(p.write, p, subID, count)
	if code != 200 {
		h.t.Fatalf("claim: %d %s", code, b)
	}
	return decode[struct {
		Items []claimResp `json:"items"`
	}](h.t, b).Items
}

func (h *prjHarness) qAck(p testProject, subID, msgID, token, status, result string) (int, []byte) {
	h.t.Helper()
	return h.do(p.write, "POST", p.path("/subscriptions/"+subID+"/receipts"),
		fmt.Sprintf(`{"messageId":%q,"token":%q,"status":%q,"result":%q}`, msgID, token, status, result))
}

// qReceipts pages through a subscription's receipts.
func (h *prjHarness) qReceipts(p testProject, subID string, limit int) []receiptResp {
	h.t.Helper()
	var all []receiptResp
	cursor := ""
	for i := 0; ; i++ {
		if i > 1000 {
			h.t.Fatal("receipts listing does not end")
		}
		q := fmt.Sprintf("?limit=%d", limit)
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		code, b := h.do(p.read, "GET", p.path("/subscriptions/"+subID+"/receipts"+q), "")
		if code != 200 {
			h.t.Fatalf("receipts: %d %s", code, b)
		}
		page := decode[listResp[receiptResp]](h.t, b)
		all = append(all, page.Items...)
		if page.NextCursor == nil {
			return all
		}
		cursor = *page.NextCursor
	}
}

func (h *prjHarness) qSnap(p testProject) queueSnap {
	h.t.Helper()
	code, b := h.do(p.read, "GET", p.path(""), "")
	if code != 200 {
		h.t.Fatalf("snapshot: %d %s", code, b)
	}
	return decode[queueSnap](h.t, b)
}

// redisNow is the Redis clock (the one leases are measured by), in ms.
func (h *prjHarness) redisNow() int64 {
	h.t.Helper()
	tm, err := h.admin.Time(context.Background()).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return tm.UnixMilli()
}

// waitRedisPast polls until Redis's clock has passed ms.
func (h *prjHarness) waitRedisPast(ms int64) {
	h.t.Helper()
	testenv.Eventually(h.t, 30*time.Second, func() bool { return h.redisNow() > ms }, "redis clock did not pass %d", ms)
}

// keysUnder lists the project's physical keys starting with prefix (SCAN).
func (h *prjHarness) keysUnder(prefix string) []string {
	h.t.Helper()
	var out []string
	it := h.admin.Scan(context.Background(), 0, prefix+"*", 1000).Iterator()
	for it.Next(context.Background()) {
		out = append(out, it.Val())
	}
	if err := it.Err(); err != nil {
		h.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func TestQueueTopicsAndSubscriptions(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	other := h.project()
	top := h.qTopic(p, "orders")
	if top.Name != "orders" || top.Description != "d" || top.CreatedAt == 0 || len(top.ID) != 36 {
		t.Fatalf("topic: %+v", top)
	}
	code, b := h.do(p.write, "POST", p.path("/topics"), `{"name":"orders"}`)
	wantError(t, code, b, 409, "topic_name_taken")
	// Another project has its own name space.
	h.qTopic(other, "orders")
	for _, body := range []string{`{}`, `{"name":""}`, `{"name":1}`, `{"name":null}`, `{"name":"a\u0007b"}`,
		`{"name":"` + strings.Repeat("x", 129) + `"}`, `{"name":"\ud800"}`, `{"name":"a","name":"b"}`} {
		code, b := h.do(p.write, "POST", p.path("/topics"), body)
		wantError(t, code, b, 400, "invalid_topic_name")
	}
	code, b = h.do(p.write, "POST", p.path("/topics"), `{"name":"x","description":5}`)
	wantError(t, code, b, 400, "invalid_json")
	code, b = h.do(p.write, "POST", p.path("/topics"), `[1]`)
	wantError(t, code, b, 400, "invalid_json")
	code, b = h.do(p.read, "POST", p.path("/topics"), `{"name":"ro"}`)
	wantError(t, code, b, 403, "forbidden")

	sub := h.qSub(p, top.ID, "billing")
	if sub.TopicID != top.ID || sub.Status != "online" || sub.Name != "billing" {
		t.Fatalf("subscription: %+v", sub)
	}
	code, b = h.do(p.write, "POST", p.path("/subscriptions"), fmt.Sprintf(`{"topicId":%q,"name":"x"}`, ids.New()))
	wantError(t, code, b, 404, "topic_not_found")
	code, b = h.do(p.write, "POST", p.path("/subscriptions"), `{"topicId":"nope","name":"x"}`)
	wantError(t, code, b, 404, "topic_not_found")
	// Another project's topic id is not this project's.
	code, b = h.do(other.write, "POST", other.path("/subscriptions"), fmt.Sprintf(`{"topicId":%q,"name":"x"}`, top.ID))
	wantError(t, code, b, 404, "topic_not_found")
	code, b = h.do(p.write, "POST", p.path("/subscriptions"), fmt.Sprintf(`{"topicId":%q}`, top.ID))
	wantError(t, code, b, 400, "invalid_json")

	code, b = h.do(p.write, "PATCH", p.path("/subscriptions/"+sub.ID), `{"status":"paused"}`)
	if code != 200 || decode[subResp](t, b).Status != "paused" {
		t.Fatalf("pause: %d %s", code, b)
	}
	for _, body := range []string{`{}`, `{"status":"off"}`, `{"status":null}`, `{"status":1}`, `{"status":"\ud800"}`} {
		code, b := h.do(p.write, "PATCH", p.path("/subscriptions/"+sub.ID), body)
		wantError(t, code, b, 400, "invalid_subscription_status")
	}
	code, b = h.do(other.write, "PATCH", other.path("/subscriptions/"+sub.ID), `{"status":"online"}`)
	wantError(t, code, b, 404, "subscription_not_found")
	code, b = h.do(p.write, "PUT", p.path("/subscriptions/"+sub.ID), `{"status":"online"}`)
	wantError(t, code, b, 405, "method_not_allowed")

	s := h.qSnap(p)
	if len(s.Topics) != 1 || s.Topics[0] != top || len(s.Subscriptions) != 1 || s.Subscriptions[0].Status != "paused" ||
		s.Subscriptions[0].ID != sub.ID {
		t.Fatalf("snapshot: %+v", s)
	}
}

func TestQueuePublishIdempotency(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{DedupeWindow: 2 * time.Second}, nil)
	p := h.project()
	top := h.qTopic(p, "events")
	first := h.qPublish(p, top.ID, "evt-1", `{"b":[1,2.0,{"y":true,"x":null}],"a":"\u00e9"}`)
	if first.ProducerID != "producer-1" || first.ClientEventID != "evt-1" || first.TopicID != top.ID ||
		first.SizeBytes != int64(len(`{"a":"é","b":[1,2,{"x":null,"y":true}]}`)) {
		t.Fatalf("first: %+v", first)
	}
	// Same identity, same value: keys reordered, other whitespace and
	// number spelling → the same message, 200.
	code, b := h.qPublishRaw(p, top.ID, "producer-1", "evt-1", "{ \"a\" : \"é\",\n\t\"b\": [1.0, 2, {\"x\":null, \"y\":true}] }")
	if code != 200 {
		t.Fatalf("replay: %d %s", code, b)
	}
	if again := decode[msgResp](t, b); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("replay answered %+v, first %+v", again, first)
	}
	if !strings.Contains(string(b), `"payload":{"a":"é","b":[1,2,{"x":null,"y":true}]}`) {
		t.Fatalf("payload not canonical: %s", b)
	}
	// Different payload → conflict; other identities are independent.
	code, b = h.qPublishRaw(p, top.ID, "producer-1", "evt-1", `{"a":"e"}`)
	wantError(t, code, b, 409, "publish_conflict")
	other := h.qPublish(p, top.ID, "evt-2", `{"a":"é","b":[1,2,{"x":null,"y":true}]}`)
	code, b = h.qPublishRaw(p, top.ID, "producer-2", "evt-1", `{"a":"é","b":[1,2,{"x":null,"y":true}]}`)
	if code != 201 || decode[msgResp](t, b).ID == first.ID || other.ID == first.ID {
		t.Fatalf("other identities: %d %s", code, b)
	}
	// After the dedupe window the identity is free again.
	h.waitRedisPast(first.PublishedAt + 2000)
	code, b = h.qPublishRaw(p, top.ID, "producer-1", "evt-1", `{"a":"e"}`)
	if code != 201 || decode[msgResp](t, b).ID == first.ID {
		t.Fatalf("after the window: %d %s", code, b)
	}

	// Listing in publish order, paged with an opaque cursor.
	var ids []string
	cursor := ""
	for range 10 {
		q := "?limit=2"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		code, b := h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages"+q), "")
		if code != 200 {
			t.Fatalf("messages: %d %s", code, b)
		}
		page := decode[listResp[msgResp]](t, b)
		for _, m := range page.Items {
			ids = append(ids, m.ID)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if len(ids) != 4 || ids[0] != first.ID || ids[1] != other.ID {
		t.Fatalf("listing: %v", ids)
	}
	for _, q := range []string{"?cursor=xyz", "?cursor=" + b64("abc"), "?cursor=MS0x%3D"} {
		code, b := h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages"+q), "")
		wantError(t, code, b, 400, "invalid_cursor")
	}
	code, b = h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages?limit=101"), "")
	wantError(t, code, b, 400, "invalid_limit")
	code, b = h.do(p.read, "GET", p.path("/topics/"+ids[0]+"/messages"), "")
	wantError(t, code, b, 404, "topic_not_found")
}

func TestQueuePublishValidation(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "v")
	big := `{"k":"` + strings.Repeat("x", 16384-8) + `"}` // 16384 bytes canonical
	if code, b := h.qPublishRaw(p, top.ID, "p", "exact", big); code != 201 {
		t.Fatalf("16 KiB payload: %d %s", code, b)
	}
	// Whitespace does not count: the normalized form does.
	spaced := "{ \"k\" :  \"" + strings.Repeat("x", 16384-8) + "\" }"
	if code, b := h.qPublishRaw(p, top.ID, "p", "spaced", spaced); code != 201 {
		t.Fatalf("16 KiB normalized payload with spaces: %d %s", code, b)
	}
	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"too large", `{"producerId":"p","clientEventId":"e","payload":{"k":"` + strings.Repeat("x", 16384-7) + `"}}`, 400, "message_too_large"},
		{"array", `{"producerId":"p","clientEventId":"e","payload":[1]}`, 400, "invalid_payload"},
		{"string", `{"producerId":"p","clientEventId":"e","payload":"{}"}`, 400, "invalid_payload"},
		{"null", `{"producerId":"p","clientEventId":"e","payload":null}`, 400, "invalid_payload"},
		{"missing", `{"producerId":"p","clientEventId":"e"}`, 400, "invalid_payload"},
		{"integer beyond 2^53", `{"producerId":"p","clientEventId":"e","payload":{"n":9007199254740993}}`, 400, "invalid_payload"},
		{"negative integer beyond 2^53", `{"producerId":"p","clientEventId":"e","payload":{"n":-9007199254740993}}`, 400, "invalid_payload"},
		{"number out of range", `{"producerId":"p","clientEventId":"e","payload":{"n":1e400}}`, 400, "invalid_payload"},
		{"duplicate key in payload", `{"producerId":"p","clientEventId":"e","payload":{"a":1,"a":2}}`, 400, "invalid_payload"},
		{"lone surrogate in payload", `{"producerId":"p","clientEventId":"e","payload":{"a":"\ud800"}}`, 400, "invalid_payload"},
		{"producerId missing", `{"clientEventId":"e","payload":{}}`, 400, "invalid_json"},
		{"producerId empty", `{"producerId":"","clientEventId":"e","payload":{}}`, 400, "invalid_json"},
		{"clientEventId number", `{"producerId":"p","clientEventId":1,"payload":{}}`, 400, "invalid_json"},
		{"clientEventId control char", `{"producerId":"p","clientEventId":"a\nb","payload":{}}`, 400, "invalid_json"},
		{"not an object", `[]`, 400, "invalid_json"},
		{"trailing data", `{"producerId":"p","clientEventId":"e","payload":{}} x`, 400, "invalid_json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			code, b := h.do(p.write, "POST", p.path("/topics/"+top.ID+"/messages"), c.body)
			wantError(t, code, b, c.status, c.code)
		})
	}
	if code, b := h.qPublishRaw(p, top.ID, "p", "safe", `{"n":9007199254740992,"f":1e-300,"g":-0.0}`); code != 201 ||
		!strings.Contains(string(b), `"payload":{"f":1e-300,"g":0,"n":9007199254740992}`) {
		t.Fatalf("largest safe integer: %d %s", code, b)
	}
	code, b := h.qPublishRaw(p, ids.New(), "p", "e", `{}`)
	wantError(t, code, b, 404, "topic_not_found")
	code, b = h.do(p.read, "POST", p.path("/topics/"+top.ID+"/messages"), `{"producerId":"p","clientEventId":"e","payload":{}}`)
	wantError(t, code, b, 403, "forbidden")
}

// Ten claimers race over one subscription with 100 messages: every message
// is leased exactly once (a long lease: no redelivery), nobody gets a
// message twice, and every ack with its token succeeds.
func TestQueueConcurrentClaimers(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "race")
	sub := h.qSub(p, top.ID, "workers")
	want := map[string]bool{}
	for i := range 100 {
		want[h.qPublish(p, top.ID, fmt.Sprintf("e%d", i), fmt.Sprintf(`{"i":%d}`, i)).ID] = true
	}
	var mu sync.Mutex
	leased := map[string][]string{} // message id → tokens
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for w := range 10 {
		wg.Go(func() {
			for range 200 {
				code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/claim"), fmt.Sprintf(`{"count":%d}`, 1+w%4))
				if code != 200 {
					errs <- fmt.Sprintf("claim: %d %s", code, b)
					return
				}
				items := decode[struct {
					Items []claimResp `json:"items"`
				}](t, b).Items
				if len(items) == 0 {
					return
				}
				for _, it := range items {
					if it.Receipt.Attempts != 1 || it.Receipt.Status != "leased" || it.LeaseUntil == 0 || it.Token == "" {
						errs <- fmt.Sprintf("item: %+v", it)
					}
					mu.Lock()
					leased[it.Message.ID] = append(leased[it.Message.ID], it.Token)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if len(leased) != 100 {
		t.Fatalf("%d messages leased, want 100", len(leased))
	}
	for id, toks := range leased {
		if !want[id] || len(toks) != 1 {
			t.Fatalf("message %s leased %d times", id, len(toks))
		}
	}
	// Nothing is left to claim, and every token acknowledges its message.
	if items := h.qClaim(p, sub.ID, 20); len(items) != 0 {
		t.Fatalf("claimed again: %d", len(items))
	}
	for id, toks := range leased {
		if code, b := h.qAck(p, sub.ID, id, toks[0], "processed", "ok"); code != 200 {
			t.Fatalf("ack %s: %d %s", id, code, b)
		}
	}
	for _, r := range h.qReceipts(p, sub.ID, 37) {
		if r.Status != "processed" || r.Attempts != 1 || r.Result == nil || *r.Result != "ok" || r.LeaseUntil != nil {
			t.Fatalf("receipt: %+v", r)
		}
	}
}

// Ten claimers race while leases keep expiring (nobody acknowledges): every
// (message, attempt) is leased exactly once, and a message's next lease
// starts only after the previous one ended (Redis clock) — never two leases
// of one message at a time.
func TestQueueConcurrentClaimersWithExpiry(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{Lease: 200 * time.Millisecond}, nil)
	p := h.project()
	top := h.qTopic(p, "expiry")
	sub := h.qSub(p, top.ID, "workers")
	const msgs, rounds = 20, 3
	for i := range msgs {
		h.qPublish(p, top.ID, fmt.Sprintf("e%d", i), `{}`)
	}
	type lease struct {
		attempt        int
		start, leaseTo int64
	}
	var mu sync.Mutex
	leases := map[string][]lease{}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(leases) < msgs {
			return false
		}
		for _, ls := range leases {
			if len(ls) < rounds {
				return false
			}
		}
		return true
	}
	var wg sync.WaitGroup
	errs := make(chan string, 10)
	deadline := time.Now().Add(30 * time.Second)
	for w := range 10 {
		wg.Go(func() {
			for !done() && time.Now().Before(deadline) {
				code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/claim"), fmt.Sprintf(`{"count":%d}`, 1+w%3))
				if code != 200 {
					errs <- fmt.Sprintf("claim: %d %s", code, b)
					return
				}
				items := decode[struct {
					Items []claimResp `json:"items"`
				}](t, b).Items
				mu.Lock()
				for _, it := range items {
					leases[it.Message.ID] = append(leases[it.Message.ID], lease{it.Receipt.Attempts, it.Receipt.UpdatedAt, it.LeaseUntil})
				}
				mu.Unlock()
				if len(items) == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if !done() {
		t.Fatalf("not every message reached %d attempts: %v", rounds, leases)
	}
	for id, ls := range leases {
		slices.SortFunc(ls, func(a, b lease) int { return a.attempt - b.attempt })
		for i, l := range ls {
			if l.attempt != i+1 {
				t.Fatalf("message %s: attempts %+v (a duplicate or a gap)", id, ls)
			}
			if i > 0 && l.start < ls[i-1].leaseTo {
				t.Fatalf("message %s: lease %d started at %d before lease %d ended at %d", id, l.attempt, l.start, i, ls[i-1].leaseTo)
			}
		}
	}
}

func TestQueueAckFencing(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{Lease: time.Second}, nil)
	p := h.project()
	top := h.qTopic(p, "fence")
	sub := h.qSub(p, top.ID, "s")
	m1 := h.qPublish(p, top.ID, "m1", `{"n":1}`)
	m2 := h.qPublish(p, top.ID, "m2", `{"n":2}`)
	items := h.qClaim(p, sub.ID, 1)
	if len(items) != 1 || items[0].Message.ID != m1.ID || items[0].Message.Payload["n"] != float64(1) {
		t.Fatalf("claim: %+v", items)
	}
	tok := items[0].Token
	// Ack while the lease runs: 200; the same again: 200 (idempotent,
	// even after the lease's end); another result or status: conflict.
	code, b := h.qAck(p, sub.ID, m1.ID, tok, "processed", "done")
	if code != 200 {
		t.Fatalf("ack: %d %s", code, b)
	}
	r1 := decode[receiptResp](t, b)
	if r1.Status != "processed" || *r1.Result != "done" || r1.Attempts != 1 || r1.LeaseUntil != nil {
		t.Fatalf("receipt: %+v", r1)
	}
	h.waitRedisPast(items[0].LeaseUntil)
	code, b2 := h.qAck(p, sub.ID, m1.ID, tok, "processed", "done")
	if code != 200 || string(b2) != string(b) {
		t.Fatalf("second ack: %d %s (first %s)", code, b2, b)
	}
	code, b = h.qAck(p, sub.ID, m1.ID, tok, "processed", "other")
	wantError(t, code, b, 409, "receipt_conflict")
	code, b = h.qAck(p, sub.ID, m1.ID, tok, "failed", "done")
	wantError(t, code, b, 409, "receipt_conflict")
	// A processed receipt is never leased again.
	// m2: the lease expires before the ack → lease_expired at once.
	items = h.qClaim(p, sub.ID, 5)
	if len(items) != 1 || items[0].Message.ID != m2.ID {
		t.Fatalf("claim m2: %+v", items)
	}
	old := items[0]
	h.waitRedisPast(old.LeaseUntil)
	code, b = h.qAck(p, sub.ID, m2.ID, old.Token, "processed", "")
	wantError(t, code, b, 409, "lease_expired")
	code, b = h.qAck(p, sub.ID, m2.ID, "random-token", "processed", "")
	wantError(t, code, b, 409, "lease_token_mismatch")
	// Claimed again: attempt 2, a new token; the old one stays expired,
	// a random one a mismatch, the new one acknowledges (empty result).
	items = h.qClaim(p, sub.ID, 5)
	if len(items) != 1 || items[0].Message.ID != m2.ID || items[0].Receipt.Attempts != 2 || items[0].Token == old.Token {
		t.Fatalf("re-claim: %+v", items)
	}
	code, b = h.qAck(p, sub.ID, m2.ID, old.Token, "processed", "")
	wantError(t, code, b, 409, "lease_expired")
	code, b = h.qAck(p, sub.ID, m2.ID, tok, "processed", "")
	wantError(t, code, b, 409, "lease_token_mismatch") // m1's token
	code, b = h.qAck(p, sub.ID, m2.ID, items[0].Token, "failed", "")
	if code != 200 || decode[receiptResp](t, b).Status != "failed" || *decode[receiptResp](t, b).Result != "" {
		t.Fatalf("ack attempt 2: %d %s", code, b)
	}
	code, b = h.qAck(p, sub.ID, m2.ID, old.Token, "failed", "")
	wantError(t, code, b, 409, "lease_expired")

	// Errors of the receipt endpoint.
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{fmt.Sprintf(`{"messageId":%q,"token":"t","status":"done"}`, m1.ID), 400, "invalid_receipt_status"},
		{fmt.Sprintf(`{"messageId":%q,"token":"t"}`, m1.ID), 400, "invalid_receipt_status"},
		{fmt.Sprintf(`{"messageId":%q,"token":"t","status":"processed","result":%q}`, m1.ID, strings.Repeat("é", 129)), 400, "result_too_large"},
		{fmt.Sprintf(`{"messageId":%q,"token":"t","status":"processed","result":5}`, m1.ID), 400, "invalid_json"},
		{`{"token":"t","status":"processed"}`, 400, "invalid_json"},
		{fmt.Sprintf(`{"messageId":%q,"status":"processed"}`, m1.ID), 400, "invalid_json"},
		{`{"messageId":"1-1","token":"t","status":"processed"}`, 404, "message_not_found"},
		{`{"messageId":"nope","token":"t","status":"processed"}`, 404, "message_not_found"},
	} {
		code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/receipts"), c.body)
		wantError(t, code, b, c.status, c.code)
	}
	code, b = h.do(p.write, "POST", p.path("/subscriptions/"+ids.New()+"/receipts"),
		fmt.Sprintf(`{"messageId":%q,"token":"t","status":"processed"}`, m1.ID))
	wantError(t, code, b, 404, "subscription_not_found")
	// A result of exactly 256 bytes is fine.
	m3 := h.qPublish(p, top.ID, "m3", `{}`)
	items = h.qClaim(p, sub.ID, 1)
	if code, b := h.qAck(p, sub.ID, m3.ID, items[0].Token, "processed", strings.Repeat("é", 128)); code != 200 {
		t.Fatalf("256-byte result: %d %s", code, b)
	}
}

// After ten leases that all expired, the receipt is exhausted: terminal,
// never claimed again, and every token it issued is lease_expired.
func TestQueueAttemptsExhausted(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{Lease: 50 * time.Millisecond}, nil)
	p := h.project()
	top := h.qTopic(p, "retry")
	sub := h.qSub(p, top.ID, "s")
	m := h.qPublish(p, top.ID, "m", `{}`)
	var tokens []string
	var last claimResp
	for attempt := 1; attempt <= 10; attempt++ {
		var items []claimResp
		testenv.Eventually(t, 10*time.Second, func() bool {
			items = h.qClaim(p, sub.ID, 3)
			return len(items) > 0
		}, "attempt %d not claimable", attempt)
		if len(items) != 1 || items[0].Message.ID != m.ID || items[0].Receipt.Attempts != attempt || slices.Contains(tokens, items[0].Token) {
			t.Fatalf("attempt %d: %+v", attempt, items)
		}
		last = items[0]
		tokens = append(tokens, last.Token)
		h.waitRedisPast(last.LeaseUntil)
	}
	rs := h.qReceipts(p, sub.ID, 10)
	if len(rs) != 1 || rs[0].Status != "exhausted" || rs[0].Attempts != 10 || rs[0].LeaseUntil != nil || rs[0].Result != nil {
		t.Fatalf("receipt after 10 expired leases: %+v", rs)
	}
	if items := h.qClaim(p, sub.ID, 3); len(items) != 0 {
		t.Fatalf("an exhausted receipt was claimed: %+v", items)
	}
	for _, tok := range []string{tokens[0], tokens[9]} {
		code, b := h.qAck(p, sub.ID, m.ID, tok, "processed", "")
		wantError(t, code, b, 409, "lease_expired")
	}
	code, b := h.qAck(p, sub.ID, m.ID, "foreign", "processed", "")
	wantError(t, code, b, 409, "lease_token_mismatch")
	// Exhausted is terminal for its only subscription: trim removes it.
	code, b = h.do(p.write, "POST", p.path("/topics/"+top.ID+"/trim"), `{}`)
	if code != 200 || decode[struct{ Trimmed int }](t, b).Trimmed != 1 {
		t.Fatalf("trim: %d %s", code, b)
	}
}

// The receipts listing shows state, never a token (nor its stored hash):
// nothing in it acknowledges anything.
func TestQueueReceiptsListingHasNoUsableToken(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "r")
	sub := h.qSub(p, top.ID, "s")
	before := h.qPublish(p, top.ID, "a", `{}`)
	h.qPublish(p, top.ID, "b", `{}`)
	h.qPublish(p, top.ID, "c", `{}`)
	items := h.qClaim(p, sub.ID, 2)
	if len(items) != 2 || items[0].Message.ID != before.ID {
		t.Fatalf("claim: %+v", items)
	}
	code, body := h.do(p.read, "GET", p.path("/subscriptions/"+sub.ID+"/receipts"), "")
	if code != 200 {
		t.Fatalf("receipts: %d %s", code, body)
	}
	list := decode[listResp[map[string]any]](t, body)
	if len(list.Items) != 3 || list.NextCursor != nil {
		t.Fatalf("receipts: %s", body)
	}
	for _, it := range items {
		if strings.Contains(string(body), it.Token) || strings.Contains(string(body), project.LeaseTokenHash(it.Token)) {
			t.Fatalf("listing leaks a token: %s", body)
		}
	}
	var strs []string
	for _, r := range list.Items {
		if _, ok := r["token"]; ok {
			t.Fatalf("receipt has a token field: %v", r)
		}
		for _, v := range r {
			if s, ok := v.(string); ok {
				strs = append(strs, s)
			}
		}
	}
	want := []string{"leased", "leased", "pending"}
	for i, r := range list.Items {
		if r["status"] != want[i] || r["subscriptionId"] != sub.ID {
			t.Fatalf("receipt %d: %v", i, r)
		}
	}
	for _, it := range items {
		for _, s := range strs {
			code, b := h.qAck(p, sub.ID, it.Message.ID, s, "processed", "")
			wantError(t, code, b, 409, "lease_token_mismatch")
		}
	}
	// The real tokens still work: nothing above disturbed the leases.
	for _, it := range items {
		if code, b := h.qAck(p, sub.ID, it.Message.ID, it.Token, "processed", ""); code != 200 {
			t.Fatalf("ack: %d %s", code, b)
		}
	}
	// A subscription created later sees only later messages.
	late := h.qSub(p, top.ID, "late")
	after := h.qPublish(p, top.ID, "d", `{}`)
	if rs := h.qReceipts(p, late.ID, 1); len(rs) != 1 || rs[0].MessageID != after.ID || rs[0].Status != "pending" {
		t.Fatalf("late subscription: %+v", rs)
	}
	if got := h.qClaim(p, late.ID, 20); len(got) != 1 || got[0].Message.ID != after.ID {
		t.Fatalf("late subscription claims: %+v", got)
	}
	code, b := h.do(p.read, "GET", p.path("/subscriptions/"+sub.ID+"/receipts?cursor=@@"), "")
	wantError(t, code, b, 400, "invalid_cursor")
	code, b = h.do(p.read, "GET", p.path("/subscriptions/"+ids.New()+"/receipts"), "")
	wantError(t, code, b, 404, "subscription_not_found")
}

// Pausing (the subscription or the project's deliveryPaused) stops new
// claims; leases issued before stay valid and acknowledge.
func TestQueuePause(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "pause")
	sub := h.qSub(p, top.ID, "s")
	for i := range 4 {
		h.qPublish(p, top.ID, fmt.Sprint(i), `{}`)
	}
	held := h.qClaim(p, sub.ID, 1)[0]
	if code, b := h.do(p.write, "PATCH", p.path("/subscriptions/"+sub.ID), `{"status":"paused"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	code, b := h.qClaimRaw(p.write, p, sub.ID, 1)
	wantError(t, code, b, 409, "subscription_paused")
	if code, b := h.qAck(p, sub.ID, held.Message.ID, held.Token, "processed", ""); code != 200 {
		t.Fatalf("ack while the subscription is paused: %d %s", code, b)
	}
	if code, b := h.do(p.write, "PATCH", p.path("/subscriptions/"+sub.ID), `{"status":"online"}`); code != 200 {
		t.Fatalf("resume: %d %s", code, b)
	}
	held = h.qClaim(p, sub.ID, 1)[0]
	if code, b := h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":true}`); code != 200 {
		t.Fatalf("project pause: %d %s", code, b)
	}
	code, b = h.qClaimRaw(p.write, p, sub.ID, 1)
	wantError(t, code, b, 409, "delivery_paused")
	if code, b := h.qAck(p, sub.ID, held.Message.ID, held.Token, "failed", "x"); code != 200 {
		t.Fatalf("ack while delivery is paused: %d %s", code, b)
	}
	if s := h.qSnap(p); len(s.Subscriptions) != 1 || s.Subscriptions[0].Status != "online" {
		t.Fatalf("snapshot: %+v", s)
	}
	h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":false}`)
	if items := h.qClaim(p, sub.ID, 20); len(items) != 2 {
		t.Fatalf("after resuming: %d items", len(items))
	}
}

func TestQueueClaimValidation(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "c")
	sub := h.qSub(p, top.ID, "s")
	for _, body := range []string{`{}`, `{"count":0}`, `{"count":21}`, `{"count":-1}`, `{"count":1.5}`, `{"count":1.0}`,
		`{"count":1e1}`, `{"count":"5"}`, `{"count":null}`, `{"count":true}`, `{"count":[1]}`, `{"count":1,"count":2}`} {
		code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/claim"), body)
		wantError(t, code, b, 400, "invalid_count")
	}
	code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/claim"), `{"count":1`)
	wantError(t, code, b, 400, "invalid_json")
	code, b = h.qClaimRaw(p.read, p, sub.ID, 1)
	wantError(t, code, b, 403, "forbidden")
	code, b = h.qClaimRaw(p.outsider, p, sub.ID, 1)
	wantError(t, code, b, 403, "forbidden")
	code, b = h.qClaimRaw(p.service, p, sub.ID, 1)
	wantError(t, code, b, 403, "user_session_required")
	code, b = h.qClaimRaw(p.write, p, ids.New(), 1)
	wantError(t, code, b, 404, "subscription_not_found")
	code, b = h.qClaimRaw(p.write, p, "not-a-uuid", 1)
	wantError(t, code, b, 404, "subscription_not_found")
	if items := h.qClaim(p, sub.ID, 20); len(items) != 0 {
		t.Fatalf("empty subscription: %+v", items)
	}
	code, b = h.do(p.write, "GET", p.path("/subscriptions/"+sub.ID+"/claim"), "")
	wantError(t, code, b, 405, "method_not_allowed")
}

// Publish numbers are judged by value, not spelling: a number whose
// canonical form would not denote exactly the value sent is refused, and an
// accepted payload replays as the same publish whether it is sent again as
// written or in its canonical form.
func TestQueuePublishNumbersByValue(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "numbers")
	for i, c := range []struct {
		num  string
		want string // canonical form; "" means 400 invalid_payload
	}{
		{"1e16", ""},
		{"1E16", ""},
		{"1.0e16", ""},
		{"10000000000000000", ""},
		{"9007199254740993.0", ""},
		{"1e400", ""},
		{"1e-400", ""},
		{"333333333.33333329", ""},
		{"0.1", "0.1"},
		{"5e-324", "5e-324"},
		{"1.5", "1.5"},
		{"-0", "0"},
		{"9007199254740992", "9007199254740992"},
		{"1.5e3", "1500"},
	} {
		t.Run(c.num, func(t *testing.T) {
			defer h.as(t)()
			event := fmt.Sprintf("n-%d", i)
			code, b := h.qPublishRaw(p, top.ID, "p", event, `{"n":`+c.num+`}`)
			if c.want == "" {
				wantError(t, code, b, 400, "invalid_payload")
				return
			}
			if code != 201 || !strings.Contains(string(b), `"payload":{"n":`+c.want+`}`) {
				t.Fatalf("publish: %d %s, want 201 with n = %s", code, b, c.want)
			}
			first := decode[msgResp](t, b)
			for _, again := range []string{c.num, c.want} {
				code, b := h.qPublishRaw(p, top.ID, "p", event, `{"n":`+again+`}`)
				if code != 200 || decode[msgResp](t, b).ID != first.ID {
					t.Fatalf("replay spelled %s: %d %s, want 200 with message %s", again, code, b, first.ID)
				}
			}
		})
	}
}
