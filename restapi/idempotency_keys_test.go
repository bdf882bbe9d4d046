package restapi_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
)

// After Redis lost a completed record (FLUSHDB, eviction), PostgreSQL's
// record of the key answers. That holds too for a request that reuses the
// key with another body whose clientMessageId repeats an earlier message:
// the repeated clientMessageId is answered before the key is looked at, and
// the request used to be answered as a success and completed in Redis under
// its own fingerprint, so the retry of the original request then got 409.
// Now the reuse gets 409 idempotency_key_reused and the original's retry
// its replay.
func TestKeyReusedWithARepeatedClientMessageIDAfterRedisLossIsRefused(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	orig := `{"body":"original","clientMessageId":"c1"}`
	code, b1, _ := h.doH(aTok, "POST", path, orig, keyHdr("K"))
	if code != 201 {
		t.Fatalf("first send: %d %s", code, b1)
	}
	other := `{"body":"other","clientMessageId":"c2"}`
	if code, b, _ := h.doH(aTok, "POST", path, other, keyHdr("K2")); code != 201 {
		t.Fatalf("second send: %d %s", code, b)
	}
	time.Sleep(100 * time.Millisecond) // let the completes land
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// Key K reused with another body (PostgreSQL holds K for "original").
	code, b, _ := h.doH(aTok, "POST", path, other, keyHdr("K"))
	if code != 409 {
		t.Errorf("key K reused with another request after Redis lost its record: %d %s, want 409 idempotency_key_reused", code, b)
	}
	time.Sleep(100 * time.Millisecond) // let a complete land
	// The original request retried with its key.
	code, b2, hdr := h.doH(aTok, "POST", path, orig, keyHdr("K"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of the original request: %d %s, want 201 replay of %s", code, b2, b1)
	}
}

// The handler accepts the dialog id in any letter case, so the same send
// retried with the id in upper case (a client or proxy that normalises
// URLs) is the same request: a replay, not 409 idempotency_key_reused (the
// fingerprint hashes the canonical id, as it does the body's ids).
func TestRetryWithTheDialogIDInUpperCaseIsAReplay(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	body := `{"body":"same request"}`
	code, b1, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", body, keyHdr("case"))
	if code != 201 {
		t.Fatalf("first send: %d %s", code, b1)
	}
	code, b2, hdr := h.doH(aTok, "POST", "/v1/dialogs/"+strings.ToUpper(d.ID)+"/messages", body, keyHdr("case"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry with the dialog id in upper case: %d %s, want 201 replay of %s", code, b2, b1)
	}
}

// The retry of a committed send with an attachment fails the attachment
// check (the attachment is linked now), and the key's record in PostgreSQL
// answers instead, once Redis lost it. When that lookup itself fails
// (PostgreSQL busy or unreachable), the answer is the lookup's 503, which a
// client retries: not the check's 400 invalid_attachment, which tells the
// client for good that a message it did write was not.
func TestARetryWhoseKeyLookupFailsIsNotRefusedForGood(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	att := h.uploadedAttachment(aTok, d.ID)
	send := `{"body":"see attached","attachmentIds":["` + att.ID + `"]}`
	code, b1, _ := h.doH(aTok, "POST", path, send, keyHdr("with-file"))
	if code != 201 {
		t.Fatalf("first send: %d %s", code, b1)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(redisDump(t, r), "state=completed")
	}, "the key's record was not completed in Redis")
	admin := r.AdminClient(0)
	defer admin.Close()
	ctx := context.Background()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The idempotency table is locked elsewhere while the retry looks.
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	code, b, _ := h.doH(aTok, "POST", path, send, keyHdr("with-file"))
	_ = tx.Rollback(ctx)
	wantError(t, code, b, 503, "database_busy")
	// With the table free again the retry is the first answer's replay.
	code, b2, hdr := h.doH(aTok, "POST", path, send, keyHdr("with-file"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the lock: %d %s, want the replay of %s", code, b2, b1)
	}
}

// A send answered with the message its clientMessageId repeats (a client
// resending under a fresh key after a lost answer) records its key in
// PostgreSQL too, naming that message. Once Redis lost the key's record,
// the key reused for another request is refused 409 (no second message),
// and the key's own request is replayed.
func TestARepeatedClientMessageIDRecordsItsKey(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	orig := `{"body":"hello","clientMessageId":"c1"}`
	code, b1, _ := h.doH(aTok, "POST", path, orig, keyHdr("k1"))
	if code != 201 {
		t.Fatalf("first send: %d %s", code, b1)
	}
	code, b2, hdr := h.doH(aTok, "POST", path, orig, keyHdr("k2"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("the same message under a fresh key: %d %s (replayed %q), want 201 with the stored message, not a replay",
			code, b2, hdr.Get("Idempotent-Replayed"))
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return strings.Count(redisDump(t, r), "state=completed") == 2
	}, "the keys' records were not completed in Redis")
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	code, b, _ := h.doH(aTok, "POST", path, `{"body":"something else"}`, keyHdr("k2"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
		t.Fatalf("%d messages of alice, want 1", n)
	}
	code, b4, hdr := h.doH(aTok, "POST", path, orig, keyHdr("k2"))
	if code != 201 || !bytes.Equal(b4, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of k2's request: %d %s, want the replay of %s", code, b4, b2)
	}
}
