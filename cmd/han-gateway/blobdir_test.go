package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The gateway refuses to start on a blob folder another local user could
// change: one writable by every user, one of another user, or one inside
// a folder of another user (who could rename it away and put their own in
// its place). Whoever can write there can replace an attachment's bytes
// with others that are then served as the attachment. The default folder,
// <temp dir>/han-blobs, lies in the shared temporary directory, where
// another user may have made it first. A private folder reached through a
// symbolic link, or inside a sticky folder such as /tmp, is fine.
func TestStartRefusesABlobFolderOthersCanChange(t *testing.T) {
	const other = 4242 // a uid that is not the test's
	chown := func(t *testing.T, p string) {
		t.Helper()
		if err := os.Chown(p, other, other); err != nil {
			t.Fatalf("chown (the tests run as root): %v", err)
		}
	}
	mkdir := func(t *testing.T, p string, mode os.FileMode) string {
		t.Helper()
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name string
		// folder makes the value of HAN_BLOB_DIR in base ("": unset, the
		// default folder in base as TMPDIR).
		folder  func(t *testing.T, base string) string
		refused string // "": starts
	}{
		{"writable by every user", func(t *testing.T, base string) string {
			return mkdir(t, filepath.Join(base, "blobs"), 0o777)
		}, "writable by every user"},
		{"sticky and writable by every user", func(t *testing.T, base string) string {
			return mkdir(t, filepath.Join(base, "blobs"), 0o1777)
		}, "writable by every user"},
		{"of another user", func(t *testing.T, base string) string {
			p := mkdir(t, filepath.Join(base, "blobs"), 0o700)
			chown(t, p)
			return p
		}, "belongs to another user"},
		{"inside a folder of another user", func(t *testing.T, base string) string {
			chown(t, mkdir(t, filepath.Join(base, "home"), 0o755))
			return filepath.Join(base, "home", "blobs")
		}, "belongs to another user"},
		{"default folder made first by another user", func(t *testing.T, base string) string {
			chown(t, mkdir(t, filepath.Join(base, "han-blobs"), 0o755))
			return ""
		}, "belongs to another user"},
		{"private folder through a link in a sticky folder", func(t *testing.T, base string) string {
			p := mkdir(t, filepath.Join(base, "private"), 0o750)
			shared := mkdir(t, filepath.Join(base, "shared"), 0o1777)
			if err := os.Symlink(p, filepath.Join(shared, "blobs")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(shared, "blobs")
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			t.Setenv("TMPDIR", base)
			vars := baseEnv()
			if dir := c.folder(t, base); dir != "" {
				vars["HAN_BLOB_DIR"] = dir
			}
			m := quietMain(t, vars)
			err := m.Run(context.Background())
			_ = m.Close()
			switch {
			case c.refused == "" && err != nil:
				t.Fatalf("start: %v", err)
			case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || m.Addr() != ""):
				t.Fatalf("start: %v (listening on %q), want a refusal saying %q", err, m.Addr(), c.refused)
			}
		})
	}
}
