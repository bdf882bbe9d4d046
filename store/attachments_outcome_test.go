package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// MarkAttachmentUploaded tells the caller when its write may have landed
// although it failed (ErrUploadOutcomeUnknown: keep the blob) from when
// PostgreSQL wrote nothing: a statement the server refused (a value it
// cannot store, a lock wait over the request budget), or one never sent. (A write whose answer was lost after the commit is
// TestUploadKeepsItsBlobWhenTheCommitsAnswerIsLost in restapi.)
func TestMarkAttachmentUploadedTellsAKnownFailure(t *testing.T) {
	f := newOrphanFixture(t)
	ctx := context.Background()
	a, err := f.st.CreateAttachment(ctx, store.CreateAttachment{ID: ids.New(), DialogID: f.dialog, UploaderID: f.user,
		Filename: "a.txt", ContentType: "text/plain", SizeBytes: 5, UploadTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// U+0000 cannot be stored in text: the server refuses the statement.
	_, err = f.st.MarkAttachmentUploaded(ctx, a.ID, "ab/"+a.ID+"-x", "bad\x00sum")
	if err == nil || !store.IsPGUnstorableText(err) || errors.Is(err, store.ErrUploadOutcomeUnknown) {
		t.Fatalf("a statement the server refused: %v, want a known failure", err)
	}
	// A row lock held past the request budget: the server gives up the
	// wait itself (lock_timeout) and says so.
	f.st.SetRequestTimeout(200 * time.Millisecond)
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM attachments WHERE id=$1 FOR UPDATE", a.ID); err != nil {
		t.Fatal(err)
	}
	_, err = f.st.MarkAttachmentUploaded(ctx, a.ID, "ab/"+a.ID+"-x", strings.Repeat("0", 64))
	_ = tx.Rollback(ctx)
	if !store.IsDatabaseBusy(err) || errors.Is(err, store.ErrUploadOutcomeUnknown) {
		t.Fatalf("a write that waited on a lock past its budget: %v, want a known database_busy", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.st.MarkAttachmentUploaded(cancelled, a.ID, "ab/"+a.ID+"-x", strings.Repeat("0", 64))
	if err == nil || errors.Is(err, store.ErrUploadOutcomeUnknown) {
		t.Fatalf("a statement never sent: %v, want a known failure", err)
	}
	if got, err := f.st.GetAttachment(ctx, a.ID); err != nil || got.Status != store.AttachmentPending {
		t.Fatalf("after two failed writes: %+v %v, want the attachment still pending", got, err)
	}
}
