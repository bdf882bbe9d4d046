package restapi_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
)

// loseRedisRecord waits for the completed Redis record of the request just
// answered, then empties DB0 of r: Redis lost the record and only
// PostgreSQL still has it.
func loseRedisRecord(t *testing.T, r *testenv.RedisServer) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(redisDump(t, r), "state=completed")
	}, "no completed record in Redis")
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// ageRecords moves the creation of user's idempotency records and
// attachments back in time, as if they were made recordTTL-left ago: each
// record has only left of its life.
func (h *harness) ageRecords(user string, left, recordTTL time.Duration) {
	h.t.Helper()
	ctx := context.Background()
	by := (recordTTL - left).Milliseconds()
	for _, q := range []string{
		`UPDATE idempotency_records SET created_at = created_at - $2 * interval '1 millisecond',
			expires_at = expires_at - $2 * interval '1 millisecond' WHERE user_id = $1`,
		`UPDATE attachments SET created_at = created_at - $2 * interval '1 millisecond',
			upload_expires_at = upload_expires_at - $2 * interval '1 millisecond' WHERE uploader_id = $1`,
	} {
		if _, err := h.pool.Exec(ctx, q, user, by); err != nil {
			h.t.Fatal(err)
		}
	}
}

// A record Redis lost is re-warmed from PostgreSQL for what is left of the
// PostgreSQL row's life, not for a fresh HAN_IDEMPOTENCY_TTL counted from
// the retry: once the row expired, the key is absent and runs again
// (it got 409 idempotency_key_reused for up to a whole TTL more).
func TestRewarmedRecordExpiresWithItsPostgresRow(t *testing.T) {
	const ttl = time.Hour
	const left = 2 * time.Second
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, idem: restapi.IdempotencyConfig{RecordTTL: ttl}})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"
	if code, b, _ := h.doH(aTok, "POST", path, `{"body":"first"}`, keyHdr("rewarm")); code != 201 {
		t.Fatalf("%d %s", code, b)
	}
	loseRedisRecord(t, r)
	h.ageRecords(alice, left, ttl)
	code, b, hdr := h.doH(aTok, "POST", path, `{"body":"first"}`, keyHdr("rewarm"))
	if code != 201 || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay from PostgreSQL: %d %s", code, b)
	}
	ctx := context.Background()
	admin := r.AdminClient(0)
	defer admin.Close()
	keys, err := admin.Keys(ctx, "han:api:idem:{msg_send:"+alice+":*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("re-warmed record: %v %v", keys, err)
	}
	if pttl := admin.PTTL(ctx, keys[0]).Val(); pttl <= 0 || pttl > left {
		t.Fatalf("re-warmed record lives %v, want at most the %v left of its PostgreSQL row", pttl, left)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return h.count("SELECT count(*) FROM idempotency_records WHERE user_id=$1 AND expires_at > now()", alice) == 0
	}, "the PostgreSQL row did not expire")
	code, b, hdr = h.doH(aTok, "POST", path, `{"body":"second"}`, keyHdr("rewarm"))
	if code != 201 || hdr.Get("Idempotent-Replayed") != "" || !strings.Contains(string(b), `"body":"second"`) {
		t.Fatalf("a key whose PostgreSQL record expired must run again: %d %s", code, b)
	}
}

// The janitor removes a never-uploaded attachment HAN_IDEMPOTENCY_TTL
// after its upload URL expired, counting on the init's record to be gone
// by then. A record re-warmed after a Redis loss must be gone too: a retry
// after the purge runs again (it got 404 attachment_not_found from a
// replay of the purged attachment).
func TestRewarmedInitRecordDoesNotOutliveItsAttachment(t *testing.T) {
	const ttl = time.Hour
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, idem: restapi.IdempotencyConfig{RecordTTL: ttl},
		att: restapi.AttachmentConfig{UploadURLTTL: 200 * time.Millisecond}})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	initBody := fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, d.ID)
	code, a1, _ := h.doH(aTok, "POST", "/v1/attachments", initBody, keyHdr("att-rewarm"))
	if code != 201 {
		t.Fatalf("%d %s", code, a1)
	}
	loseRedisRecord(t, r)
	h.ageRecords(alice, time.Second, ttl)
	code, a2, hdr := h.doH(aTok, "POST", "/v1/attachments", initBody, keyHdr("att-rewarm"))
	if code != 201 || !bytes.Equal(a1, a2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay from PostgreSQL: %d %s, want %s", code, a2, a1)
	}
	// The janitor's purge of never-uploaded attachments, with its
	// retention of HAN_IDEMPOTENCY_TTL.
	ctx := context.Background()
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, err := h.store.PurgeAbandonedAttachments(ctx, ttl, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, "the janitor never purged the pending attachment")
	code, a3, hdr := h.doH(aTok, "POST", "/v1/attachments", initBody, keyHdr("att-rewarm"))
	if code != 201 || hdr.Get("Idempotent-Replayed") != "" || bytes.Equal(a1, a3) {
		t.Fatalf("an init retried after its record expired and the janitor ran: %d %s (replayed %q), want a new 201",
			code, a3, hdr.Get("Idempotent-Replayed"))
	}
}

// A committed attachment init whose uploader then left the dialog, and whose
// Redis record was lost, is replayed to its retry from PostgreSQL: the
// membership check runs before the key's row is looked at, and the key's
// live row answers instead of its 404 dialog_not_found.
func TestInitRetryAfterLeavingReplays(t *testing.T) {
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, time.Second)
	h := newIdemHarness(t, idemOpts{rdb: rdb, rt: rt})
	_, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)
	initBody := fmt.Sprintf(`{"dialogId":%q,"filename":"a.txt","contentType":"text/plain","sizeBytes":3}`, d.ID)
	code, a1, _ := h.doH(bTok, "POST", "/v1/attachments", initBody, keyHdr("init-then-left"))
	if code != 201 {
		t.Fatalf("%d %s", code, a1)
	}
	loseRedisRecord(t, r)
	if _, err := h.pool.Exec(context.Background(), "DELETE FROM dialog_members WHERE dialog_id=$1 AND user_id=$2", d.ID, bob); err != nil {
		t.Fatal(err)
	}
	code, a2, hdr := h.doH(bTok, "POST", "/v1/attachments", initBody, keyHdr("init-then-left"))
	if code != 201 || !bytes.Equal(a1, a2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a committed init after leaving and a Redis loss: %d %s, want the replay of %s", code, a2, a1)
	}
	// Another request under the key is still 409, and one without a
	// record is still 404.
	other := strings.Replace(initBody, "a.txt", "b.txt", 1)
	code, b, _ := h.doH(bTok, "POST", "/v1/attachments", other, keyHdr("init-then-left"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	code, b, _ = h.doH(bTok, "POST", "/v1/attachments", other, keyHdr("init-never-ran"))
	wantError(t, code, b, 404, "dialog_not_found")
}
