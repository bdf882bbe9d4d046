package restapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
)

// stallFolder mounts over dir a FUSE file system that never answers: every
// file-system call under dir blocks, as on a network file system whose
// server went silent. The returned function ends the stall (the blocked
// calls fail, dir is itself again); cleanup calls it too.
func stallFolder(t *testing.T, dir string) (unstall func()) {
	t.Helper()
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err == nil {
		err = syscall.Mount("han-stall", dir, "fuse.han-stall", syscall.MS_NOSUID|syscall.MS_NODEV,
			fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd))
		if err != nil {
			syscall.Close(fd)
		}
	}
	if err != nil {
		// Mounting needs root and /dev/fuse. CI runs as root with both.
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot mount a FUSE file system (CI runs as root and must run this test): %v", err)
		}
		t.Skipf("cannot mount a FUSE file system (needs root and /dev/fuse; CI runs it): %v", err)
	}
	done := false
	unstall = func() {
		if !done {
			done = true
			syscall.Close(fd) // aborts the connection: blocked calls fail
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	}
	t.Cleanup(unstall)
	return unstall
}

// A blob folder that stalls (a network file system whose server went
// silent) answers uploads and downloads 503 blob_store_unavailable once a
// file-system call has waited BlobCallTimeout, instead of holding the
// request, its client and its blob slot for as long as the stall lasts;
// the attachment stays pending for a retry. Further transfers keep being
// answered while the folder stalls (past a few stalled calls without
// touching it), the janitor's run ends with the failure instead of
// hanging, so its other purges go on at the next run, and once the folder
// answers again uploads succeed.
func TestStalledBlobFolderIsAnsweredAndRecovers(t *testing.T) {
	dir := t.TempDir()
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir, BlobCallTimeout: time.Second})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	up := h.uploadedAttachment(aTok, d.ID)
	dl := h.downloadURL(aTok, up.ID)
	var pending []uploadResp
	for range 12 {
		code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.txt", "text/plain", 3), idemKey())
		if code != 201 {
			t.Fatalf("init: %d %s", code, b)
		}
		pending = append(pending, decode[uploadResp](t, b))
	}
	unstall := stallFolder(t, dir)

	// A client that waits a minute: without a bound it waits for ever.
	client := &http.Client{Timeout: time.Minute}
	do := func(method, signed, body string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, h.srv.URL+signed, strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s on a stalled blob folder: %v", method, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	for _, u := range pending {
		resp, b := do("PUT", u.UploadURL, "abc")
		wantError(t, resp.StatusCode, b, 503, "blob_store_unavailable")
		if ra := resp.Header.Get("Retry-After"); ra != "5" {
			t.Fatalf("Retry-After %q, want 5", ra)
		}
	}
	resp, b := do("GET", dl.URL, "")
	wantError(t, resp.StatusCode, b, 503, "blob_store_unavailable")
	if n := h.count("SELECT count(*) FROM attachments WHERE id=$1 AND status='pending'", pending[0].ID); n != 1 {
		t.Fatal("the attachment is no longer pending after the stalled upload")
	}

	blobs, ok := h.api.Blobs().(*store.LocalBlobs)
	if !ok {
		t.Fatalf("blob store %T, want the local folder", h.api.Blobs())
	}
	j := store.NewJanitor(h.store, store.JanitorConfig{Blobs: blobs}, nil)
	ran := make(chan error, 1)
	go func() { _, err := j.SweepOrphanBlobs(context.Background()); ran <- err }()
	select {
	case err := <-ran:
		if err == nil {
			t.Fatal("orphan sweep of a stalled folder: no error")
		}
	case <-time.After(time.Minute):
		t.Fatal("the orphan sweep of a stalled folder never ended")
	}

	unstall()
	for i := 0; ; i++ {
		code, b := h.put(pending[0].UploadURL, "text/plain", "abc")
		if code == 200 {
			break
		}
		if i == 100 {
			t.Fatalf("upload once the folder answers again: %d %s", code, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, got := h.get(dl.URL); resp.StatusCode != 200 || string(got) != "abc" {
		t.Fatalf("download once the folder answers again: %d %q", resp.StatusCode, got)
	}
}
