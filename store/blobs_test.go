package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/han-app/gateway/store"
)

// A blob store failure is named for what it is, so the API answers it
// with its own code and operators look at the disk: a full disk or quota
// is ErrBlobStoreFull, any other file failure ErrBlobStoreUnavailable, and
// neither, nor any other file error, counts as PostgreSQL unreachable
// (although a file's errno satisfies net.Error as a dropped connection's
// does). A dropped database connection still does.
func TestBlobStoreFailuresAreNotPostgresOutages(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"disk full", store.BlobError("write", &fs.PathError{Op: "write", Path: "/blobs/ab/x", Err: syscall.ENOSPC}), store.ErrBlobStoreFull},
		{"quota", store.BlobError("write", &fs.PathError{Op: "write", Path: "/blobs/ab/x", Err: syscall.EDQUOT}), store.ErrBlobStoreFull},
		{"descriptors", store.BlobError("open", &fs.PathError{Op: "open", Path: "/blobs/ab/x", Err: syscall.EMFILE}), store.ErrBlobStoreUnavailable},
		{"I/O error", store.BlobError("sync", &fs.PathError{Op: "sync", Path: "/blobs/ab/x", Err: syscall.EIO}), store.ErrBlobStoreUnavailable},
		{"rename", store.BlobError("rename", &os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EROFS}), store.ErrBlobStoreUnavailable},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v is not %v", c.name, c.err, c.want)
		}
		if store.IsPGUnavailable(c.err) {
			t.Errorf("%s: counted as PostgreSQL unavailable", c.name)
		}
		if k := store.Kind(c.err); k != strings.ReplaceAll(strings.TrimPrefix(c.want.Error(), "store: "), " ", "_") {
			t.Errorf("%s: kind %q", c.name, k)
		}
	}
	if store.IsPGUnavailable(fmt.Errorf("open: %w", &fs.PathError{Op: "open", Path: "x", Err: syscall.ENOSPC})) {
		t.Error("a bare file error is counted as PostgreSQL unavailable")
	}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	if !store.IsPGUnavailable(fmt.Errorf("load attachment: %w", reset)) {
		t.Error("a connection reset is no longer PostgreSQL unavailable")
	}
}

// LocalBlobs tells its own failures from its source's: a folder that is
// no longer a folder is ErrBlobStoreUnavailable, while a client's broken
// upload comes back as the client's error, so the API answers 400, not a
// server failure.
func TestLocalBlobsTellsItsFailureFromTheUploads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "blobs")
	b, err := store.NewLocalBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Put(ctx, "ab/partial", errReader{}); err == nil || errors.Is(err, store.ErrBlobStoreUnavailable) ||
		errors.Is(err, store.ErrBlobStoreFull) || err.Error() != "connection reset" {
		t.Fatalf("a failing source: %v, want its own error", err)
	}
	if _, err := b.Put(ctx, "ab/x", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "cd/y", strings.NewReader("hello")); !errors.Is(err, store.ErrBlobStoreUnavailable) {
		t.Fatalf("Put into a folder that is a file: %v", err)
	}
	if _, err := b.Open(ctx, "ab/x"); !errors.Is(err, store.ErrBlobStoreUnavailable) {
		t.Fatalf("Open in a folder that is a file: %v", err)
	}
}

// A blob is on disk for good once Put returns: besides its file, Put syncs
// the folder it renamed the file into and the parent of every folder it
// created, or a power loss could take the file of an attachment
// PostgreSQL already says is uploaded. A folder that cannot be synced
// fails the Put as the store's own failure and leaves no blob behind.
func TestLocalBlobsPutSyncsItsFolders(t *testing.T) {
	root := filepath.Join(t.TempDir(), "blobs")
	b, err := store.NewLocalBlobs(root)
	if err != nil {
		t.Fatal(err)
	}
	var synced []string
	b.SetSyncDir(func(dir string) error {
		synced = append(synced, dir)
		return store.SyncDir(dir)
	})
	ctx := context.Background()
	readBlob := func(key string) (string, error) {
		f, err := b.Open(ctx, key)
		if err != nil {
			return "", err
		}
		defer f.Close()
		got, err := io.ReadAll(f)
		return string(got), err
	}

	if _, err := b.Put(ctx, "ab/cd/x", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	want := []string{root, filepath.Join(root, "ab"), filepath.Join(root, "ab", "cd")}
	if !slices.Equal(synced, want) {
		t.Fatalf("a Put that created two folders synced %q, want %q", synced, want)
	}
	if got, err := readBlob("ab/cd/x"); err != nil || got != "hello" {
		t.Fatalf("the blob after Put: %q %v", got, err)
	}
	synced = nil
	if _, err := b.Put(ctx, "ab/cd/y", strings.NewReader("hi")); err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(root, "ab", "cd")}; !slices.Equal(synced, want) {
		t.Fatalf("a Put into an existing folder synced %q, want %q", synced, want)
	}

	b.SetSyncDir(func(dir string) error { return &fs.PathError{Op: "sync", Path: dir, Err: syscall.EIO} })
	for _, key := range []string{"ab/cd/z", "ef/z"} {
		if _, err := b.Put(ctx, key, strings.NewReader("lost")); !errors.Is(err, store.ErrBlobStoreUnavailable) {
			t.Fatalf("Put %s with a folder that cannot be synced: %v, want ErrBlobStoreUnavailable", key, err)
		}
		if _, err := b.Open(ctx, key); !errors.Is(err, store.ErrBlobNotFound) {
			t.Fatalf("Open %s after its failed Put: %v, want ErrBlobNotFound", key, err)
		}
	}
}
