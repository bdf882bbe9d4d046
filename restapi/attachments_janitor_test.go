package restapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
)

// ageAttachment moves an attachment's clock back by age, as if it had been
// created and uploaded that long ago.
func ageAttachment(t *testing.T, h *harness, id string, age time.Duration) {
	t.Helper()
	if _, err := h.pool.Exec(context.Background(), `UPDATE attachments SET created_at = created_at - $2 * interval '1 millisecond',
		upload_expires_at = upload_expires_at - $2 * interval '1 millisecond',
		uploaded_at = uploaded_at - $2 * interval '1 millisecond' WHERE id=$1`, id, age.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

// janitorHarness is an attachment harness whose blobs live in dir, and the
// same folder as the janitor's blob store.
func janitorHarness(t *testing.T) (*harness, string, *store.LocalBlobs) {
	t.Helper()
	dir := t.TempDir()
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir})
	blobs, err := store.NewLocalBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return h, dir, blobs
}

// An attachment uploaded but never sent (removed from the composer, a
// failed send, a script) is deleted with its blob once it is older than
// the unsent retention (24 h by default), so uploads nobody sends cannot
// fill the blob disk. Younger unsent attachments and sent ones, however
// old, keep their rows and bytes.
func TestUnsentAttachmentsArePurgedWithTheirBlobs(t *testing.T) {
	h, dir, blobs := janitorHarness(t)
	_, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)

	stale := h.uploadedAttachment(aTok, d.ID)
	fresh := h.uploadedAttachment(aTok, d.ID)
	sent := h.uploadedAttachment(aTok, d.ID)
	h.send(aTok, d.ID, fmt.Sprintf(`{"body":"see attached","attachmentIds":[%q]}`, sent.ID))
	ageAttachment(t, h, stale.ID, 30*24*time.Hour)
	ageAttachment(t, h, fresh.ID, 23*time.Hour)
	ageAttachment(t, h, sent.ID, 30*24*time.Hour)
	var before []string
	_ = filepathWalk(dir, &before)

	j := store.NewJanitor(h.store, store.JanitorConfig{Blobs: blobs}, nil) // default retention: 24 h
	if _, err := j.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := h.count("SELECT count(*) FROM attachments WHERE id=$1", stale.ID); n != 0 {
		t.Fatal("a month-old attachment no message links survives the janitor")
	}
	var after []string
	_ = filepathWalk(dir, &after)
	if len(after) != len(before)-1 {
		t.Fatalf("blob files %d before the purge, %d after; want its blob gone with it", len(before), len(after))
	}
	if n := h.count("SELECT count(*) FROM attachments WHERE id = ANY($1::uuid[])", []string{fresh.ID, sent.ID}); n != 2 {
		t.Fatalf("the janitor deleted an unsent attachment younger than the retention, or a sent one (%d of 2 left)", n)
	}
	for _, id := range []string{fresh.ID, sent.ID} {
		code, b := h.do(bTok, "GET", "/v1/attachments/"+id+"/download-url", "")
		if code != 200 {
			t.Fatalf("download url of a kept attachment: %d %s", code, b)
		}
		if resp, got := h.get(decode[downloadResp](t, b).URL); resp.StatusCode != 200 || string(got) != "abc" {
			t.Fatalf("download of a kept attachment: %d %q", resp.StatusCode, got)
		}
	}
}

// The purge and a send that links the same attachment race safely: the
// purge deletes the row before the blob, and a row a send has locked and
// linked is re-checked when the lock is released and kept, blob included.
// (A send that comes second finds the row gone: 400 invalid_attachment.)
func TestPurgeKeepsAnAttachmentASendIsLinking(t *testing.T) {
	h, _, blobs := janitorHarness(t)
	_, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)
	u := h.uploadedAttachment(aTok, d.ID)
	ageAttachment(t, h, u.ID, 30*24*time.Hour)
	msg := decode[struct {
		ID string `json:"id"`
	}](t, h.send(aTok, d.ID, `{"body":"the message the attachment joins"}`))

	// The send's link, held open: the row is locked and linked, not
	// committed yet.
	ctx := context.Background()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM attachments WHERE id=$1 AND message_id IS NULL FOR NO KEY UPDATE`, u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE attachments SET message_id=$2, position=1 WHERE id=$1`, u.ID, msg.ID); err != nil {
		t.Fatal(err)
	}
	purged := make(chan int64, 1)
	go func() {
		n, _ := h.store.PurgeUnsentAttachments(ctx, blobs, 24*time.Hour, 24*time.Hour, 100)
		purged <- n
	}()
	testenv.Eventually(t, 5*time.Second, func() bool {
		return h.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM attachments%'`) > 0
	}, "the purge does not wait for the send's lock")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := <-purged; n != 0 {
		t.Fatalf("the purge deleted %d rows, one of them linked by a send", n)
	}
	code, b := h.do(bTok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
	if code != 200 {
		t.Fatalf("download url of the linked attachment: %d %s", code, b)
	}
	if resp, got := h.get(decode[downloadResp](t, b).URL); resp.StatusCode != 200 || string(got) != "abc" {
		t.Fatalf("download of the linked attachment: %d %q", resp.StatusCode, got)
	}
}

// An init replayed while its idempotency record lives answers its first
// 201 byte for byte even when HAN_ATTACHMENT_UNSENT_TTL (at least 1h) is
// shorter than HAN_IDEMPOTENCY_TTL (24h): the janitor, wired as the
// gateway wires it, keeps an uploaded attachment no message links until
// HAN_IDEMPOTENCY_TTL after its upload URL expired, and deletes it then.
func TestInitReplayFindsAnUnsentAttachmentPastTheUnsentTTL(t *testing.T) {
	h, _, blobs := janitorHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	body := initBody(d.ID, "a.txt", "text/plain", 3)
	code, first, _ := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("k-unsent"))
	if code != 201 {
		t.Fatal(code, string(first))
	}
	u := decode[uploadResp](t, first)
	if code, b := h.put(u.UploadURL, "text/plain", "abc"); code != 200 {
		t.Fatal(code, string(b))
	}
	ageAttachment(t, h, u.ID, 2*time.Hour)
	j := store.NewJanitor(h.store, store.JanitorConfig{Blobs: blobs, UnsentRetention: time.Hour,
		PendingRetention: 24 * time.Hour}, nil)
	if _, err := j.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, again, hdr := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("k-unsent"))
	if code != 201 || string(again) != string(first) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay while its record lives: %d %s, want 201 %s replayed", code, again, first)
	}

	// Once the record of its init is gone too, nothing can find it.
	ageAttachment(t, h, u.ID, 24*time.Hour)
	if _, err := j.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := h.count("SELECT count(*) FROM attachments WHERE id=$1", u.ID); n != 0 {
		t.Fatal("an unsent attachment older than both TTLs survives the janitor")
	}
}
