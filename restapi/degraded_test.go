package restapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store/rds"
)

// timedDo is doH that also returns how long the answer took.
func (h *harness) timedDo(tok, method, path, body string, hdr map[string]string) (int, []byte, http.Header, time.Duration) {
	h.t.Helper()
	start := time.Now()
	code, b, hd := h.doH(tok, method, path, body, hdr)
	return code, b, hd, time.Since(start)
}

func (h *harness) serviceToken(svc string) string {
	h.t.Helper()
	tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: ids.New(), Kind: auth.KindService, Service: svc, TTL: time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

// uploadedAttachment creates and uploads a 3-byte text attachment.
func (h *harness) uploadedAttachment(tok, dialogID string) uploadResp {
	h.t.Helper()
	code, b, _ := h.doH(tok, "POST", "/v1/attachments",
		fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, dialogID), idemKey())
	if code != 201 {
		h.t.Fatalf("attachment init: %d %s", code, b)
	}
	u := decode[uploadResp](h.t, b)
	if code, b := h.put(u.UploadURL, "text/plain", "abc"); code != 200 {
		h.t.Fatalf("upload: %d %s", code, b)
	}
	return u
}

// DB0 down (docs/degraded-mode.md): a killed redis-server. Send, attachment init and
// download URL fail closed fast; a completed send replays from PostgreSQL;
// history, readiness (degraded) and the internal inbox keep working; when
// Redis returns, sends succeed without restarting anything.
func TestDegradedDB0RedisKilled(t *testing.T) {
	const budget = time.Second // the default HAN_REDIS_TIMEOUT
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, budget)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, idem: restapi.IdempotencyConfig{RedisBudget: budget, ProbeInterval: 50 * time.Millisecond}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	code, sent, _ := h.doH(aTok, "POST", path, `{"body":"before the outage"}`, keyHdr("done"))
	if code != 201 {
		t.Fatalf("%d %s", code, sent)
	}
	att := h.uploadedAttachment(aTok, d.ID)

	r.Kill()
	fast := func(name string, el time.Duration) {
		t.Helper()
		if el > budgetSlack*budget {
			t.Errorf("%s took %v, over the Redis budget of %v (x%d)", name, el, budget, budgetSlack)
		}
	}
	for _, c := range []struct{ name, method, path, body string }{
		{"send", "POST", path, `{"body":"during the outage"}`},
		{"attachment init", "POST", "/v1/attachments", fmt.Sprintf(`{"dialogId":%q,"filename":"b.txt","contentType":"text/plain","sizeBytes":1}`, d.ID)},
		{"download url", "GET", "/v1/attachments/" + att.ID + "/download-url", ""},
		{"send again", "POST", path, `{"body":"during the outage"}`},
	} {
		code, b, _, el := h.timedDo(aTok, c.method, c.path, c.body, idemKey())
		wantError(t, code, b, 503, "redis_unavailable")
		fast(c.name, el)
	}
	if !h.api.RedisHealth().Down() {
		t.Fatal("DB0 should be marked down")
	}
	// The completed send replays from PostgreSQL, byte for byte.
	code, b, hdr, el := h.timedDo(aTok, "POST", path, `{"body":"before the outage"}`, keyHdr("done"))
	if code != 201 || !bytes.Equal(b, sent) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay during the outage: %d %s, want %s", code, b, sent)
	}
	fast("replay", el)
	// Same key, other body: still a conflict, from PostgreSQL.
	code, b, _ = h.doH(aTok, "POST", path, `{"body":"changed"}`, keyHdr("done"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	// History (the truth is in PostgreSQL).
	if code, b := h.do(aTok, "GET", path+"?afterSeq=0", ""); code != 200 || !strings.Contains(string(b), "before the outage") {
		t.Fatalf("history during the outage: %d %s", code, b)
	}
	if code, b := h.do("", "GET", "/readyz", ""); code != 200 || !strings.Contains(string(b), `"status":"degraded"`) {
		t.Fatalf("/readyz during the outage: %d %s", code, b)
	}
	// The internal inbox keeps accepting; its event waits in the outbox.
	code, b = h.do(h.serviceToken("billing"), "POST", "/v1/internal/inbox",
		fmt.Sprintf(`{"id":%q,"kind":"invoice.paid","dialogId":%q,"data":{"amount":5}}`, "inv-"+ids.New(), d.ID))
	if code != 201 {
		t.Fatalf("inbox during the outage: %d %s", code, b)
	}
	ev := decode[inboxResp](t, b)
	if n := h.count("SELECT count(*) FROM outbox WHERE event_id=$1 AND delivered_at IS NULL", ev.EventID); n != 1 {
		t.Fatalf("the inbox event should wait in the outbox, found %d pending rows", n)
	}
	if _, b := h.do("", "GET", "/metrics", ""); !strings.Contains(string(b), "han_redis_db0_degraded 1") {
		t.Fatal("han_redis_db0_degraded should be 1 during the outage")
	}

	// Redis returns: no restart of the service.
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _, _ := h.doH(aTok, "POST", path, `{"body":"after the outage"}`, keyHdr("after"))
		return code == 201
	}, "sends did not recover after Redis came back")
	if h.api.RedisHealth().Down() {
		t.Fatal("DB0 still marked down")
	}
	if code, b := h.do(aTok, "GET", "/v1/attachments/"+att.ID+"/download-url", ""); code != 200 {
		t.Fatalf("download url after the outage: %d %s", code, b)
	}
}

// A Redis that accepts connections but does not answer (CLIENT PAUSE): the
// first request waits at most its budget, the following ones fail at once
// while the prober watches, and the service recovers when Redis answers.
func TestDegradedDB0RedisHangs(t *testing.T) {
	const budget = 300 * time.Millisecond
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, budget)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, idem: restapi.IdempotencyConfig{RedisBudget: budget, ProbeInterval: 50 * time.Millisecond}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	if code, b, _ := h.doH(aTok, "POST", path, `{"body":"warm"}`, idemKey()); code != 201 {
		t.Fatalf("%d %s", code, b)
	}
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	code, b, _, el := h.timedDo(aTok, "POST", path, `{"body":"hung"}`, idemKey())
	wantError(t, code, b, 503, "redis_unavailable")
	// The Redis wait is bounded by the budget; the rest is a PostgreSQL
	// lookup for a completed record.
	if el > (budgetSlack+1)*budget {
		t.Fatalf("first request on a hung Redis took %v (budget %v)", el, budget)
	}
	code, b, _, el = h.timedDo(aTok, "POST", path, `{"body":"hung"}`, idemKey())
	wantError(t, code, b, 503, "redis_unavailable")
	if el > budgetSlack*budget {
		t.Fatalf("second request took %v: it should fail at once while DB0 is down", el)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _, _ := h.doH(aTok, "POST", path, `{"body":"back"}`, keyHdr("back"))
		return code == 201
	}, "no recovery after the pause ended")
}

// DB0 out of memory: write scripts are refused up front, so a new send fails
// closed with 503 redis_oom and writes nothing, while a completed send still
// replays from PostgreSQL.
func TestDegradedDB0OutOfMemory(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	code, sent, _ := h.doH(aTok, "POST", path, `{"body":"before"}`, keyHdr("done"))
	if code != 201 {
		t.Fatalf("%d %s", code, sent)
	}
	ctx := context.Background()
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	before := admin.DBSize(ctx).Val()
	code, b, _ := h.doH(aTok, "POST", path, `{"body":"oom"}`, idemKey())
	wantError(t, code, b, 503, "redis_oom")
	code, b, _ = h.doH(aTok, "POST", "/v1/attachments", fmt.Sprintf(`{"dialogId":%q,"filename":"b.txt","contentType":"text/plain","sizeBytes":1}`, d.ID), idemKey())
	wantError(t, code, b, 503, "redis_oom")
	if after := admin.DBSize(ctx).Val(); after != before {
		t.Fatalf("a refused request wrote to Redis: %d keys before, %d after", before, after)
	}
	code, b, hdr := h.doH(aTok, "POST", path, `{"body":"before"}`, keyHdr("done"))
	if code != 201 || !bytes.Equal(b, sent) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay under OOM: %d %s", code, b)
	}
	if h.api.RedisHealth().Down() {
		t.Fatal("OOM is an answer, not an outage: DB0 must not be marked down")
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if code, b, _ := h.doH(aTok, "POST", path, `{"body":"after"}`, idemKey()); code != 201 {
		t.Fatalf("after OOM: %d %s", code, b)
	}
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 2 {
		t.Fatalf("%d messages, want 2", n)
	}
}

// The ACL refuses PEXPIRE: the reserve script checks before its first write,
// so the request fails with 503 redis_expiry_denied and leaves no key
// without a TTL (no key at all).
func TestIdempotencyExpiryDenied(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	ctx := context.Background()
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "api_backend", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"x"}`, idemKey())
	wantError(t, code, b, 503, "redis_expiry_denied")
	if keys := admin.Keys(ctx, "han:api:idem*").Val(); len(keys) != 0 {
		t.Fatalf("keys left behind: %v", keys)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "api_backend", "+pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	if code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"x"}`, idemKey()); code != 201 {
		t.Fatalf("after the ACL is restored: %d %s", code, b)
	}
}

// gateLimiter is a fail-closed limiter of this test's own on real Redis: one
// DB0 write per request, like the Lua limiter. When DB0 fails it defers to
// the handler where restapi.DeferDB0Failure allows, else it answers 503
// redis_unavailable as the server's limiter does.
type gateLimiter struct{ rdb redis.UniversalClient }

func (l gateLimiter) Allow(w http.ResponseWriter, r *http.Request, route string) bool {
	ctx, cancel := context.WithTimeout(r.Context(), 300*time.Millisecond)
	defer cancel()
	err := l.rdb.Set(ctx, "han:api:rl:gate:"+ids.New(), 1, time.Second).Err()
	if err == nil {
		return true
	}
	err = rds.ClassifyRedisError(err)
	if restapi.DeferDB0Failure(r, err) {
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":"redis_unavailable"}`))
	return false
}

// A limiter that cannot reach DB0 must not stop the PostgreSQL replay of a
// completed send (docs/degraded-mode.md): it defers the failure to the handler, which
// replays or fails closed, and never runs a new send without its limit.
func TestDB0FailureDeferredByTheLimiter(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, limiter: gateLimiter{rdb}})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	code, sent, _ := h.doH(aTok, "POST", path, `{"body":"done"}`, keyHdr("done"))
	if code != 201 {
		t.Fatalf("%d %s", code, sent)
	}
	att := h.uploadedAttachment(aTok, d.ID)
	r.Kill()
	code, b, hdr := h.doH(aTok, "POST", path, `{"body":"done"}`, keyHdr("done"))
	if code != 201 || !bytes.Equal(b, sent) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay behind a failed limiter: %d %s", code, b)
	}
	code, b, _ = h.doH(aTok, "POST", path, `{"body":"new"}`, idemKey())
	wantError(t, code, b, 503, "redis_unavailable")
	code, b, _ = h.doH(aTok, "GET", "/v1/attachments/"+att.ID+"/download-url", "", nil)
	wantError(t, code, b, 503, "redis_unavailable")
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	// Other routes are not deferred: the limiter fails closed itself.
	code, b = h.do(aTok, "GET", "/v1/dialogs", "")
	wantError(t, code, b, 503, "redis_unavailable") // a route without its own DB0 fallback
}
