package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrBlobNotFound is returned by BlobStore.Open for an unknown key.
var ErrBlobNotFound = errors.New("store: blob not found")

// BlobStore keeps attachment bytes. Keys are built by the service (never by
// clients) from [a-z0-9-] segments joined by "/". Implementations must be
// safe for concurrent use.
type BlobStore interface {
	// Put stores everything r yields under key. The blob becomes visible
	// only once complete: a failed or cancelled Put leaves nothing behind.
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
		return 0, fmt.Errorf("store: blob folder: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".upload-*")
	if err != nil {
		return 0, fmt.Errorf("store: blob temp file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	n, err := io.Copy(f, ctxReader{ctx, r})
	if err != nil {
		return n, err
	}
	if err := f.Sync(); err != nil {
		return n, fmt.Errorf("store: blob sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return n, fmt.Errorf("store: blob close: %w", err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		done = true
		return n, fmt.Errorf("store: blob rename: %w", err)
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
		return nil, fmt.Errorf("store: open blob: %w", err)
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
		return fmt.Errorf("store: delete blob: %w", err)
	}
	return nil
}

// ctxReader stops a copy when ctx ends (a client that went away).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
