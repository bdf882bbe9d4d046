package store_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// orphanFixture is a blob folder beside a dialog whose attachments may
// name its blobs.
type orphanFixture struct {
	t      *testing.T
	st     *store.Store
	pool   *pgxpool.Pool
	dir    string
	blobs  *store.LocalBlobs
	dialog string
	user   string
}

func newOrphanFixture(t *testing.T) *orphanFixture {
	t.Helper()
	st, pool := openStore(t)
	a, _, dialogID := twoUsers(t, st)
	dir := t.TempDir()
	blobs, err := store.NewLocalBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &orphanFixture{t: t, st: st, pool: pool, dir: dir, blobs: blobs, dialog: dialogID, user: a}
}

// blob writes a blob of attachment id, last written age ago, and returns
// its key.
func (f *orphanFixture) blob(id string, age time.Duration) string {
	f.t.Helper()
	key := id[len(id)-2:] + "/" + id + "-" + strings.ReplaceAll(ids.New(), "-", "")
	if _, err := f.blobs.Put(context.Background(), key, strings.NewReader("bytes")); err != nil {
		f.t.Fatal(err)
	}
	f.age(key, age)
	return key
}

// age sets the file's modification time age ago.
func (f *orphanFixture) age(key string, age time.Duration) {
	f.t.Helper()
	at := time.Now().Add(-age)
	if err := os.Chtimes(filepath.Join(f.dir, filepath.FromSlash(key)), at, at); err != nil {
		f.t.Fatal(err)
	}
}

// uploaded records an uploaded attachment whose row names a blob written
// age ago, and returns the attachment id and the key.
func (f *orphanFixture) uploaded(age time.Duration) (string, string) {
	f.t.Helper()
	ctx := context.Background()
	a, err := f.st.CreateAttachment(ctx, store.CreateAttachment{ID: ids.New(), DialogID: f.dialog, UploaderID: f.user,
		Filename: "a.txt", ContentType: "text/plain", SizeBytes: 5, UploadTTL: time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	key := f.blob(a.ID, age)
	if _, err := f.st.MarkAttachmentUploaded(ctx, a.ID, key, strings.Repeat("0", 64)); err != nil {
		f.t.Fatal(err)
	}
	return a.ID, key
}

func (f *orphanFixture) exists(key string) bool {
	_, err := os.Stat(filepath.Join(f.dir, filepath.FromSlash(key)))
	return err == nil
}

// The janitor's orphan sweep deletes a blob no attachment row names once
// it was last written more than an hour ago: one whose row is gone, and
// one of an attachment whose row names another blob (an upload whose
// write failed or did not land). It keeps a blob its row names, however
// old, an orphan younger than the hour (an upload whose row may be about
// to commit), and files that are no blob of an attachment. A temporary
// file of a write that ended long ago (a crash mid-upload) goes too.
func TestOrphanBlobSweepDeletesOnlyOldBlobsNoRowNames(t *testing.T) {
	f := newOrphanFixture(t)
	const old, young = 2 * time.Hour, 10 * time.Minute
	_, named := f.uploaded(old)
	goneRow := f.blob(ids.New(), old)
	rowID, _ := f.uploaded(old)
	otherOfRow := f.blob(rowID, old)
	fresh := f.blob(ids.New(), young)
	_, freshNamed := f.uploaded(young)
	stray := "ab/not-an-attachment"
	if _, err := f.blobs.Put(context.Background(), stray, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	f.age(stray, old)
	staleTemp := filepath.Join(f.dir, "ab", ".upload-123")
	liveTemp := filepath.Join(f.dir, "ab", ".upload-456")
	for _, p := range []string{staleTemp, liveTemp} {
		if err := os.WriteFile(p, []byte("part"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().Add(-old)
	if err := os.Chtimes(staleTemp, at, at); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	j := store.NewJanitor(f.st, store.JanitorConfig{Blobs: f.blobs}, slog.New(slog.NewJSONHandler(&logs, nil)))
	if _, err := j.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{named: true, goneRow: false, otherOfRow: false, fresh: true, freshNamed: true, stray: true} {
		if f.exists(key) != want {
			t.Errorf("blob %s exists: %v, want %v", key, !want, want)
		}
	}
	if _, err := os.Stat(staleTemp); err == nil {
		t.Error("a temporary file last written two hours ago is still there")
	}
	if _, err := os.Stat(liveTemp); err != nil {
		t.Errorf("the temporary file of a write in progress is gone: %v", err)
	}
	if !strings.Contains(logs.String(), `"orphan_blobs":2`) {
		t.Errorf("the janitor's log does not count the 2 orphans it deleted:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), goneRow) {
		t.Errorf("the janitor's log names a blob:\n%s", logs.String())
	}
}
