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
}

var _ BlobStore = (*LocalBlobs)(nil)

// NewLocalBlobs creates dir if needed (mode 0700).
func NewLocalBlobs(dir string) (*LocalBlobs, error) {
	if dir == "" {
		return nil, errors.New("store: blob folder not set")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create blob folder: %w", err)
	}
	return &LocalBlobs{dir: dir}, nil
}

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

// Put writes r to a temporary file beside the target and renames it.
func (l *LocalBlobs) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	p, err := l.path(key)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return 0, blobError("folder", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".upload-*")
	if err != nil {
		return 0, blobError("temp file", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	src := &ctxReader{ctx: ctx, r: r}
	n, err := io.Copy(f, src)
	if err != nil {
		if src.err != nil {
			return n, err // the source's failure, not the store's
		}
		return n, blobError("write", err)
	}
	if err := f.Sync(); err != nil {
		return n, blobError("sync", err)
	}
	if err := f.Close(); err != nil {
		return n, blobError("close", err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		done = true
		return n, blobError("rename", err)
	}
	done = true
	return n, nil
}

// Open opens the blob's file.
func (l *LocalBlobs) Open(_ context.Context, key string) (io.ReadSeekCloser, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrBlobNotFound
	}
	if err != nil {
		return nil, blobError("open", err)
	}
	return f, nil
}

// Delete removes the blob's file.
func (l *LocalBlobs) Delete(_ context.Context, key string) error {
	p, err := l.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
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
