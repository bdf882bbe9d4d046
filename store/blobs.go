package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrBlobNotFound is returned by BlobStore.Open for an unknown key.
var ErrBlobNotFound = errors.New("store: blob not found")

// Failures of the blob store itself, as opposed to the request: the upload
// or download cannot succeed until an operator acts, and nothing about
// them is PostgreSQL's.
var (
	// ErrBlobStoreFull: no space (or quota) left for the blob.
	ErrBlobStoreFull = errors.New("store: blob store full")
	// ErrBlobStoreUnavailable: a file of the blob store could not be
	// created, written, opened or removed (folder missing or unwritable,
	// descriptors exhausted, an I/O error).
	ErrBlobStoreUnavailable = errors.New("store: blob store unavailable")
)

// blobError classifies a file system failure of op as ErrBlobStoreFull or
// ErrBlobStoreUnavailable, keeping the cause for errors.Is.
func blobError(op string, err error) error {
	kind := ErrBlobStoreUnavailable
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		kind = ErrBlobStoreFull
	}
	return fmt.Errorf("store: blob %s: %w: %w", op, kind, err)
}

// BlobStore keeps attachment bytes. Keys are built by the service (never by
// clients) from [a-z0-9-] segments joined by "/". Implementations must be
// safe for concurrent use.
type BlobStore interface {
	// Put stores everything r yields under key. The blob becomes visible
	// only once complete: a failed or cancelled Put leaves nothing behind.
	// An error of r is returned as it is; a failure of the store itself is
	// ErrBlobStoreFull or ErrBlobStoreUnavailable.
	Put(ctx context.Context, key string, r io.Reader) (int64, error)
	// Open returns the blob for reading (ErrBlobNotFound when absent).
	Open(ctx context.Context, key string) (io.ReadSeekCloser, error)
	// Delete removes a blob; deleting an absent blob is not an error.
	Delete(ctx context.Context, key string) error
}

// LocalBlobs is a BlobStore in a local folder (one file per blob, written to
// a temporary file and renamed into place).
type LocalBlobs struct {
	dir string
	// guard bounds each file-system call (DefaultBlobCallTimeout).
	guard *stallGuard
	// syncDir flushes a folder's entries to disk; nil means syncDir.
	syncDir func(dir string) error
}

var _ BlobStore = (*LocalBlobs)(nil)

// NewLocalBlobs creates dir if needed (mode 0700), and refuses a folder
// another local user could change (privateFolder).
func NewLocalBlobs(dir string) (*LocalBlobs, error) {
	if dir == "" {
		return nil, errors.New("store: blob folder not set")
	}
	l := &LocalBlobs{dir: dir, guard: &stallGuard{timeout: DefaultBlobCallTimeout}}
	if err := l.guard.do(func() error { return l.mkdirAll(dir) }, nil); err != nil {
		return nil, fmt.Errorf("store: create blob folder: %w", err)
	}
	var resolved string
	err := l.guard.do(func() error {
		var err error
		resolved, err = privateFolder(dir)
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("store: blob folder %s refused: %w (it must belong to the gateway's user and be writable by no other)", dir, err)
	}
	l.dir = resolved
	return l, nil
}

// SetCallTimeout replaces DefaultBlobCallTimeout as the bound of each
// file-system call; it must be called before the store is used.
func (l *LocalBlobs) SetCallTimeout(d time.Duration) { l.guard.timeout = d }

// Dir is the folder.
func (l *LocalBlobs) Dir() string { return l.dir }

func (l *LocalBlobs) path(key string) (string, error) {
	if key == "" || len(key) > 200 {
		return "", errors.New("store: invalid blob key")
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" {
			return "", errors.New("store: invalid blob key")
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", errors.New("store: invalid blob key")
			}
		}
	}
	return filepath.Join(l.dir, filepath.FromSlash(key)), nil
}

// Put writes r to a temporary file beside the target, syncs it, renames it
// and syncs the folder: once Put returns, the blob is on disk for good, so
// a power loss cannot take the file of an attachment PostgreSQL says is
// uploaded. A folder it fails to sync fails the Put, and the blob goes.
// Each file-system call is bounded (DefaultBlobCallTimeout): on a folder
// that stalls, Put fails with ErrBlobStoreUnavailable instead of waiting
// as long as the stall.
func (l *LocalBlobs) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	p, err := l.path(key)
	if err != nil {
		return 0, err
	}
	g := l.guard
	if err := g.do(func() error { return l.mkdirAll(filepath.Dir(p)) }, nil); err != nil {
		return 0, blobError("folder", err)
	}
	var f *os.File
	err = g.do(func() error {
		var err error
		f, err = os.CreateTemp(filepath.Dir(p), tempPrefix+"*")
		return err
	}, func() { f.Close(); os.Remove(f.Name()) })
	if err != nil {
		return 0, blobError("temp file", err)
	}
	done := false
	defer func() {
		if !done {
			g.cleanup(func() { f.Close(); os.Remove(f.Name()) })
		}
	}()
	src := &ctxReader{ctx: ctx, r: r}
	n, err := io.Copy(&guardedWriter{f: f, g: g}, src)
	if err != nil {
		if src.err != nil {
			return n, err // the source's failure, not the store's
		}
		return n, blobError("write", err)
	}
	if err := g.do(f.Sync, nil); err != nil {
		return n, blobError("sync", err)
	}
	if err := g.do(f.Close, nil); err != nil {
		return n, blobError("close", err)
	}
	done = true
	if err := g.do(func() error { return os.Rename(f.Name(), p) }, nil); err != nil {
		// A rename left stalled may still land: the blob is then an
		// orphan the janitor's sweep deletes.
		g.cleanup(func() { os.Remove(f.Name()) })
		return n, blobError("rename", err)
	}
	if err := g.do(func() error { return l.sync(filepath.Dir(p)) }, nil); err != nil {
		g.cleanup(func() { os.Remove(p) })
		return n, blobError("sync folder", err)
	}
	return n, nil
}

// mkdirAll creates dir and its missing parents like os.MkdirAll, syncing
// the parent of each folder it creates, so the new folder, and the blobs
// renamed into it, survive a power loss. A folder another Put created
// meanwhile has its parent synced all the same: that Put may not have
// synced it yet.
func (l *LocalBlobs) mkdirAll(dir string) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return &os.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := l.sync(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

func (l *LocalBlobs) sync(dir string) error {
	if l.syncDir != nil {
		return l.syncDir(dir)
	}
	return syncDir(dir)
}

// syncDir flushes dir's entries (files created, renamed or removed in it)
// to disk.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Open opens the blob's file; its reads, seeks and the open itself are
// bounded like every call of the store (DefaultBlobCallTimeout).
func (l *LocalBlobs) Open(_ context.Context, key string) (io.ReadSeekCloser, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, err
	}
	var f *os.File
	err = l.guard.do(func() error {
		var err error
		f, err = os.Open(p)
		return err
	}, func() { f.Close() })
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrBlobNotFound
	}
	if err != nil {
		return nil, blobError("open", err)
	}
	return &guardedFile{f: f, g: l.guard}, nil
}

// Delete removes the blob's file.
func (l *LocalBlobs) Delete(_ context.Context, key string) error {
	p, err := l.path(key)
	if err != nil {
		return err
	}
	if err := l.guard.do(func() error { return os.Remove(p) }, nil); err != nil && !errors.Is(err, os.ErrNotExist) {
		return blobError("delete", err)
	}
	return nil
}

// ctxReader stops a copy when ctx ends (a client that went away) and
// records the source's failure, so Put tells it from its own.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
	err error // the first error other than io.EOF, from ctx or r
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		c.err = err
		return 0, err
	}
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}
