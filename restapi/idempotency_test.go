package restapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
)

// pgIdemRows returns the idempotency_records rows of a user as JSON text.
func (h *harness) pgIdemRows(userID string) string {
	h.t.Helper()
	var s string
	if err := h.pool.QueryRow(context.Background(),
		`SELECT COALESCE(string_agg(row_to_json(r)::text, E'\n'), '') FROM idempotency_records r WHERE user_id=$1`, userID).Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	return s
}

func TestIdempotentSendReplaysByteForByte(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	alice, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)
	d2 := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	secret := "private words " + ids.New()
	body := fmt.Sprintf(`{"body":%q,"clientMessageId":"c1"}`, secret)

	code, b1, hdr := h.doH(aTok, "POST", path, body, keyHdr("send-1"))
	if code != 201 || hdr.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first send: %d %s (replayed %q)", code, b1, hdr.Get("Idempotent-Replayed"))
	}
	if !strings.Contains(string(b1), `"attachments":[]`) {
		t.Fatalf("message DTO must carry an attachments array: %s", b1)
	}
	// Same key, same request (spacing and key order do not matter).
	for _, same := range []string{body, fmt.Sprintf(` { "clientMessageId" : "c1" , "body" : %q } `, secret)} {
		code, b2, hdr := h.doH(aTok, "POST", path, same, keyHdr("send-1"))
		if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %s (replayed %q), want 201 %s", code, b2, hdr.Get("Idempotent-Replayed"), b1)
		}
	}
	// Same key, another body or another dialog: 409.
	code, b, _ := h.doH(aTok, "POST", path, `{"body":"something else","clientMessageId":"c1"}`, keyHdr("send-1"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	code, b, _ = h.doH(aTok, "POST", "/v1/dialogs/"+d2.ID+"/messages", body, keyHdr("send-1"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
		t.Fatalf("%d message rows, want 1", n)
	}
	// Keys are per user: bob's "send-1" is his own.
	if code, b, _ := h.doH(bTok, "POST", path, body, keyHdr("send-1")); code != 201 || bytes.Equal(b, b1) {
		t.Fatalf("another user's send with the same key: %d %s", code, b)
	}

	// Neither Redis nor PostgreSQL holds the body (or the raw key).
	// The complete is not waited for by the request: it lands right after.
	var dump string
	testenv.Eventually(t, 5*time.Second, func() bool {
		dump = redisDump(t, env.Redis)
		return strings.Contains(dump, "state=completed")
	}, "no completed record in Redis")
	pg := h.pgIdemRows(alice)
	if pg == "" {
		t.Fatal("no idempotency_records row written with the message")
	}
	for _, where := range []string{dump, pg} {
		if strings.Contains(where, secret) || strings.Contains(where, "private words") || strings.Contains(where, "send-1") {
			t.Fatalf("an idempotency record holds the body or the raw key:\n%s", where)
		}
	}
}

func TestIdempotencyKeyRules(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		code                     string
	}{
		{"send without key", "POST", path, `{"body":"x"}`, nil, 400, "idempotency_key_required"},
		{"send with empty key", "POST", path, `{"body":"x"}`, keyHdr(""), 400, "idempotency_key_required"},
		{"key of 256 characters", "POST", path, `{"body":"x"}`, keyHdr(strings.Repeat("k", 256)), 400, "invalid_idempotency_key"},
		{"non-ASCII key", "POST", path, `{"body":"x"}`, keyHdr("ключ"), 400, "invalid_idempotency_key"},
		{"attachment init without key", "POST", "/v1/attachments",
			fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, d.ID), nil, 400, "idempotency_key_required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b, _ := h.doH(aTok, c.method, c.path, c.body, c.hdr)
			wantError(t, code, b, c.status, c.code)
		})
	}
	// 255 printable characters, space included, are a valid key.
	long := strings.Repeat("k", 250) + " ~!@#"
	if code, b, _ := h.doH(aTok, "POST", path, `{"body":"x"}`, keyHdr(long)); code != 201 {
		t.Fatalf("255-character key: %d %s", code, b)
	}
	// Two header lines are refused.
	req, _ := http.NewRequest("POST", h.srv.URL+path, strings.NewReader(`{"body":"x"}`))
	req.Header.Set("Authorization", "Bearer "+aTok)
	req.Header.Add("Idempotency-Key", "a")
	req.Header.Add("Idempotency-Key", "b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("two Idempotency-Key lines: %d", resp.StatusCode)
	}
	// Dialog create: the key is optional, and honoured when given.
	title := "once " + ids.New()
	body := fmt.Sprintf(`{"memberIds":[%q],"title":%q}`, bob, title)
	if code, b, _ := h.doH(aTok, "POST", "/v1/dialogs", body, nil); code != 201 {
		t.Fatalf("dialog without key: %d %s", code, b)
	}
	_, b1, _ := h.doH(aTok, "POST", "/v1/dialogs", body, keyHdr("dlg-1"))
	// A message in between changes lastSeq; the replay still answers what
	// the creation answered.
	d3 := decode[dialogResp](t, b1)
	if code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d3.ID+"/messages", `{"body":"x"}`, idemKey()); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	code, b2, hdr := h.doH(aTok, "POST", "/v1/dialogs", body, keyHdr("dlg-1"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("dialog replay: %d %s, want %s", code, b2, b1)
	}
	code, b, _ := h.doH(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":"other"}`, bob), keyHdr("dlg-1"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	if n := h.count("SELECT count(*) FROM dialogs WHERE title=$1", title); n != 2 {
		t.Fatalf("%d dialogs titled once, want 2 (one without key, one with)", n)
	}
}

// 20 concurrent identical requests: exactly one message row; every other
// answer is the same 201 replayed or 409 idempotency_in_progress with
// Retry-After: 1.
func TestConcurrentIdenticalSends(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	const n = 20
	type result struct {
		code  int
		body  []byte
		retry string
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			code, b, hdr := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"once"}`, keyHdr("burst"))
			results[i] = result{code, b, hdr.Get("Retry-After")}
		}(i)
	}
	close(start)
	wg.Wait()
	var first []byte
	created, busy := 0, 0
	for _, r := range results {
		switch r.code {
		case 201:
			created++
			if first == nil {
				first = r.body
			} else if !bytes.Equal(first, r.body) {
				t.Fatalf("201 answers differ: %s vs %s", first, r.body)
			}
		case 409:
			busy++
			if string(r.body) != `{"error":"idempotency_in_progress"}` || r.retry != "1" {
				t.Fatalf("409 answer: %s Retry-After %q", r.body, r.retry)
			}
		default:
			t.Fatalf("unexpected answer %d %s", r.code, r.body)
		}
	}
	if created == 0 {
		t.Fatal("no request succeeded")
	}
	if rows := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); rows != 1 {
		t.Fatalf("%d message rows, want exactly 1 (%d created, %d in progress)", rows, created, busy)
	}
	// Once settled, the key replays.
	code, b, hdr := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"once"}`, keyHdr("burst"))
	if code != 201 || !bytes.Equal(b, first) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the burst: %d %s", code, b)
	}
}

// The handler heartbeats its lock: a request that runs several lock TTLs
// keeps it, and a concurrent retry gets 409 in_progress all along.
func TestIdempotencyLockHeartbeat(t *testing.T) {
	const lockTTL = 300 * time.Millisecond
	h := newIdemHarness(t, idemOpts{idem: restapi.IdempotencyConfig{LockTTL: lockTTL}})
	// The send must outlive several lock TTLs: give it a request budget
	// far longer than the test, so no lock_timeout ends it early.
	h.store.SetRequestTimeout(time.Minute)
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	ctx := context.Background()

	// Hold the dialog's row lock: the send blocks inside its transaction.
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id=$1 FOR UPDATE", d.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code int
		body []byte
	}
	done := make(chan result, 1)
	go func() {
		code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"slow"}`, keyHdr("slow"))
		done <- result{code, b}
	}()
	admin := env.Redis.AdminClient(0)
	defer admin.Close()
	pattern := "han:api:idemlock:{msg_send:" + alice + ":*"
	lockKey := func() string {
		keys, _ := admin.Keys(ctx, pattern).Result()
		if len(keys) == 1 {
			return keys[0]
		}
		return ""
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return lockKey() != "" }, "the send never took its lock")
	started := time.Now()
	// Poll past three lock TTLs: the lock must never lapse.
	testenv.Eventually(t, 10*time.Second, func() bool {
		if lockKey() == "" {
			t.Fatalf("the lock lapsed after %v while its request was still running", time.Since(started))
		}
		return time.Since(started) > 3*lockTTL
	}, "unreachable")
	code, b, hdr := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"slow"}`, keyHdr("slow"))
	if code != 409 || string(b) != `{"error":"idempotency_in_progress"}` || hdr.Get("Retry-After") != "1" {
		t.Fatalf("retry while running: %d %s", code, b)
	}
	select {
	case r := <-done:
		t.Fatalf("the send finished while its transaction was blocked: %d %s", r.code, r.body)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 201 {
		t.Fatalf("slow send: %d %s", r.code, r.body)
	}
	code, b, _ = h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"slow"}`, keyHdr("slow"))
	if code != 201 || !bytes.Equal(b, r.body) {
		t.Fatalf("replay after the slow send: %d %s", code, b)
	}
	// The completion that releases the lock is sent after the response,
	// in the next shared pipeline (within milliseconds), so the replay
	// above may come first: the lock must be gone soon after, not at once.
	testenv.Eventually(t, 2*time.Second, func() bool { return lockKey() == "" }, "the lock outlived its request")
}

// With both TTLs shortened, an expired key behaves as absent in Redis and in
// PostgreSQL: the same key runs again, even with another body.
func TestExpiredIdempotencyKeyBehavesAsAbsent(t *testing.T) {
	const ttl = 400 * time.Millisecond
	h := newIdemHarness(t, idemOpts{idem: restapi.IdempotencyConfig{RecordTTL: ttl}})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	if code, b, _ := h.doH(aTok, "POST", path, `{"body":"first"}`, keyHdr("short")); code != 201 {
		t.Fatalf("%d %s", code, b)
	}
	admin := env.Redis.AdminClient(0)
	defer admin.Close()
	ctx := context.Background()
	testenv.Eventually(t, 5*time.Second, func() bool {
		keys, _ := admin.Keys(ctx, "han:api:idem:{msg_send:"+alice+":*").Result()
		return len(keys) == 0 && h.count("SELECT count(*) FROM idempotency_records WHERE user_id=$1 AND expires_at > now()", alice) == 0
	}, "the record did not expire in Redis and PostgreSQL")
	if n := h.count("SELECT count(*) FROM idempotency_records WHERE user_id=$1", alice); n != 1 {
		t.Fatalf("the expired row should still be there (not purged yet): %d", n)
	}
	code, b, hdr := h.doH(aTok, "POST", path, `{"body":"second"}`, keyHdr("short"))
	if code != 201 || hdr.Get("Idempotent-Replayed") != "" || !strings.Contains(string(b), `"body":"second"`) {
		t.Fatalf("an expired key must run again: %d %s", code, b)
	}
	// The expired row was replaced, not duplicated.
	if n := h.count("SELECT count(*) FROM idempotency_records WHERE user_id=$1 AND expires_at > now()", alice); n != 1 {
		t.Fatalf("live rows after reuse: %d", n)
	}
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 2 {
		t.Fatalf("messages: %d, want 2", n)
	}
}

// Redis loses the record (FLUSHDB, then a restart without persistence): the
// retry answers the original response from PostgreSQL, re-warms Redis, and
// no second message is created.
func TestRedisLossReplaysFromPostgres(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	send := `{"body":"exactly once"}`
	code, b1, _ := h.doH(aTok, "POST", path, send, keyHdr("lost"))
	if code != 201 {
		t.Fatalf("%d %s", code, b1)
	}
	initBody := fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, d.ID)
	code, a1, _ := h.doH(aTok, "POST", "/v1/attachments", initBody, keyHdr("lost-att"))
	if code != 201 {
		t.Fatalf("%d %s", code, a1)
	}
	ctx := context.Background()
	lose := map[string]func(){
		"flushdb": func() {
			admin := r.AdminClient(0)
			defer admin.Close()
			if err := admin.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		},
		"restart without persistence": func() {
			if err := r.Restart(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, name := range []string{"flushdb", "restart without persistence"} {
		t.Run(name, func(t *testing.T) {
			lose[name]()
			admin := r.AdminClient(0)
			defer admin.Close()
			if n := admin.DBSize(ctx).Val(); n != 0 {
				t.Fatalf("Redis still holds %d keys", n)
			}
			var code int
			var b2 []byte
			var hdr http.Header
			// Right after a restart the pool may hold dead connections: the
			// first attempt can fail closed (503), never duplicate.
			testenv.Eventually(t, 5*time.Second, func() bool {
				code, b2, hdr = h.doH(aTok, "POST", path, send, keyHdr("lost"))
				return code != 503
			}, "send kept failing after Redis came back")
			if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry after Redis lost the record: %d %s, want %s", code, b2, b1)
			}
			if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
				t.Fatalf("%d message rows, want 1", n)
			}
			code, a2, _ := h.doH(aTok, "POST", "/v1/attachments", initBody, keyHdr("lost-att"))
			if code != 201 || !bytes.Equal(a1, a2) {
				t.Fatalf("attachment init after Redis lost the record: %d %s, want %s", code, a2, a1)
			}
			if n := h.count("SELECT count(*) FROM attachments WHERE uploader_id=$1", alice); n != 1 {
				t.Fatalf("%d attachment rows, want 1", n)
			}
			// Re-warmed: the next retry is answered by Redis again.
			dump := redisDump(t, r)
			if strings.Count(dump, "state=completed") != 2 {
				t.Fatalf("Redis was not re-warmed:\n%s", dump)
			}
		})
	}
}

// A send's own checks run before its key's record is looked at, so a retry
// of a committed send failed them once Redis no longer held the answer:
// its attachment is linked now (400 invalid_attachment) and its sender may
// have left the dialog since (404). The key's record in PostgreSQL answers
// instead: the same bytes, once, and 409 for another body under that key.
func TestRetryOfACommittedSendWithAnAttachmentReplays(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	alice, aTok := h.user()
	bob, bTok := h.user()
	carol, _ := h.user()
	d := h.dialog(aTok, bob, carol)
	path := "/v1/dialogs/" + d.ID + "/messages"
	flush := func() {
		admin := r.AdminClient(0)
		defer admin.Close()
		if err := admin.FlushDB(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}

	att := h.uploadedAttachment(aTok, d.ID)
	send := fmt.Sprintf(`{"body":"see attached","attachmentIds":[%q]}`, att.ID)
	code, b1, _ := h.doH(aTok, "POST", path, send, keyHdr("with-file"))
	if code != 201 {
		t.Fatalf("%d %s", code, b1)
	}
	flush()
	code, b2, hdr := h.doH(aTok, "POST", path, send, keyHdr("with-file"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry with the attachment after Redis lost the record: %d %s, want %s", code, b2, b1)
	}
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
		t.Fatalf("%d message rows, want 1", n)
	}
	flush()
	other := fmt.Sprintf(`{"body":"another text","attachmentIds":[%q]}`, att.ID)
	code, b3, _ := h.doH(aTok, "POST", path, other, keyHdr("with-file"))
	wantError(t, code, b3, 409, "idempotency_key_reused")

	// A sender who left the dialog after the send.
	code, c1, _ := h.doH(bTok, "POST", path, `{"body":"before leaving"}`, keyHdr("then-left"))
	if code != 201 {
		t.Fatalf("%d %s", code, c1)
	}
	if _, err := h.pool.Exec(context.Background(), "DELETE FROM dialog_members WHERE dialog_id=$1 AND user_id=$2", d.ID, bob); err != nil {
		t.Fatal(err)
	}
	flush()
	code, c2, _ := h.doH(bTok, "POST", path, `{"body":"before leaving"}`, keyHdr("then-left"))
	if code != 201 || !bytes.Equal(c1, c2) {
		t.Fatalf("retry by a sender who left, after Redis lost the record: %d %s, want %s", code, c2, c1)
	}
	// Without a record of the key the checks still refuse.
	code, c3, _ := h.doH(bTok, "POST", path, `{"body":"after leaving"}`, keyHdr("fresh"))
	wantError(t, code, c3, 404, "dialog_not_found")
}
