package restapi_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/han-app/gateway/restapi"
)

// A PUT answered 5xx may have stored the upload all the same, and its
// client retries the same bytes. Once the attachment is uploaded, that
// retry is judged by the bytes alone: the same bytes are 200, other bytes
// of the same size 409 attachment_already_uploaded, another size 400
// upload_size_mismatch. None of them writes to the blob store, so a retry
// after the upload that took the disk's last space (or while the folder
// is broken) still learns that the attachment is uploaded instead of
// being told 507 or 503 and giving up on an attachment it could send.
func TestRetryOfAnUploadedAttachmentNeedsNoBlobStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "blobs")
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	u := h.uploadedAttachment(aTok, d.ID) // "abc", text/plain
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, b := h.put(u.UploadURL, "text/plain", "abc")
	if code != 200 {
		t.Fatalf("retry with the same bytes: %d %s, want 200", code, b)
	}
	if got := decode[attachmentResp](t, b); got.ID != u.ID || got.SizeBytes != 3 || got.ContentType != "text/plain" {
		t.Fatalf("retry answer: %s", b)
	}
	code, b = h.put(u.UploadURL, "text/plain", "abd")
	wantError(t, code, b, 409, "attachment_already_uploaded")
	code, b = h.put(u.UploadURL, "text/plain", "ab")
	wantError(t, code, b, 400, "upload_size_mismatch")
	code, b = h.put(u.UploadURL, "text/plain", "abcd")
	wantError(t, code, b, 413, "payload_too_large")
	if n := h.count("SELECT count(*) FROM attachments WHERE id=$1 AND status='uploaded'", u.ID); n != 1 {
		t.Fatalf("the attachment is no longer uploaded after the retries")
	}
}
