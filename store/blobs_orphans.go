package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
)

// DefaultOrphanBlobAge is the age (since its file was last written) from
// which a blob no attachment row names is an orphan the janitor deletes.
// A blob is written before the row that names it: the upload renames its
// file into place and then commits the row within its request budget
// (HAN_DB_REQUEST_TIMEOUT, seconds). An hour is far beyond that, so a blob
// whose row is about to be committed is never taken for an orphan.
const DefaultOrphanBlobAge = time.Hour

// BlobLister is a BlobStore whose blobs can be listed, for the janitor's
// orphan sweep. LocalBlobs is one. The sweep reads a blob's attachment
// from its key, "<shard>/<attachment id>-<suffix>" as the API builds it.
type BlobLister interface {
	BlobStore
	// ListBlobs examines up to max blobs in key order, starting after the
	// key after ("" from the first), and returns the keys of those last
	// written before cutoff, and the key to resume from on the next call
	// ("" once the listing reached the end).
	ListBlobs(ctx context.Context, after string, cutoff time.Time, max int) (keys []string, next string, err error)
}

var _ BlobLister = (*LocalBlobs)(nil)

// tempPrefix starts the name of the temporary file a Put writes before it
// renames it into place.
const tempPrefix = ".upload-"

// ListBlobs walks the shard folders in name order. A temporary file of a
// Put last written before cutoff is removed on the way: its write ended
// long ago without being renamed into place (the process died), so no key
// names it and nothing else would.
func (l *LocalBlobs) ListBlobs(ctx context.Context, after string, cutoff time.Time, max int) ([]string, string, error) {
	if max <= 0 {
		return nil, after, nil
	}
	afterShard, afterName, _ := strings.Cut(after, "/")
	shards, err := l.readDir(l.dir)
	if err != nil {
		return nil, "", blobError("list", err)
	}
	var keys []string
	examined := 0
	for _, sh := range shards {
		if !sh.IsDir() || sh.Name() < afterShard || !l.validKey(sh.Name()+"/x") {
			continue
		}
		from := ""
		if sh.Name() == afterShard {
			from = afterName
		}
		found, last, n, err := l.listShard(sh.Name(), from, cutoff, max-examined)
		if err != nil {
			return keys, "", err
		}
		keys, examined = append(keys, found...), examined+n
		if examined >= max {
			return keys, sh.Name() + "/" + last, nil
		}
		if err := ctx.Err(); err != nil {
			return keys, "", err
		}
	}
	return keys, "", nil
}

// listShard examines up to max files of one shard folder whose names sort
// after from, and returns the old blobs' keys, the last name examined and
// how many were.
func (l *LocalBlobs) listShard(shard, from string, cutoff time.Time, max int) ([]string, string, int, error) {
	entries, err := l.readDir(filepath.Join(l.dir, shard))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", 0, nil
	}
	if err != nil {
		return nil, "", 0, blobError("list", err)
	}
	var keys []string
	last, n := "", 0
	for _, e := range entries {
		if n >= max {
			break
		}
		name := e.Name()
		if name <= from || !e.Type().IsRegular() {
			continue
		}
		last, n = name, n+1
		var info fs.FileInfo
		err := l.guard.do(func() error {
			var err error
			info, err = e.Info()
			return err
		}, nil)
		if errors.Is(err, errBlobStalled) {
			return keys, last, n, blobError("list", err)
		}
		if err != nil || !info.ModTime().Before(cutoff) {
			continue // gone meanwhile, or too young
		}
		if strings.HasPrefix(name, tempPrefix) {
			_ = l.guard.do(func() error { return os.Remove(filepath.Join(l.dir, shard, name)) }, nil)
			continue
		}
		if key := shard + "/" + name; l.validKey(key) {
			keys = append(keys, key)
		}
	}
	return keys, last, n, nil
}

// readDir is os.ReadDir bounded like every call of the store.
func (l *LocalBlobs) readDir(dir string) ([]os.DirEntry, error) {
	var entries []os.DirEntry
	err := l.guard.do(func() error {
		var err error
		entries, err = os.ReadDir(dir)
		return err
	}, nil)
	return entries, err
}

func (l *LocalBlobs) validKey(key string) bool {
	_, err := l.path(key)
	return err == nil
}

// blobAttachmentID is the attachment id a blob key names: keys are
// "<shard>/<attachment id>-<random suffix>". It reports false for a key of
// another form, which the orphan sweep never deletes.
func blobAttachmentID(key string) (string, bool) {
	_, name, ok := strings.Cut(key, "/")
	if !ok || len(name) < 38 || name[36] != '-' || !ids.Valid(name[:36]) {
		return "", false
	}
	return name[:36], true
}

// SweepOrphanBlobs examines up to max blobs of blobs after the key after
// (BlobLister.ListBlobs), and deletes those last written before cutoff
// that no attachment row names, with one query for the lot. It returns how
// many it deleted and the key to resume from ("" at the end), also when it
// fails: a blob it could not delete is tried again on the next round. A
// blob whose row exists is never deleted; nor is one written after cutoff,
// whose row may not be committed yet, nor a file whose name is not a blob
// key of an attachment. Instances sweeping the same folder at once are
// safe: deleting a deleted blob is no error.
func (s *Store) SweepOrphanBlobs(ctx context.Context, blobs BlobLister, after string, cutoff time.Time, max int) (int, string, error) {
	keys, next, err := blobs.ListBlobs(ctx, after, cutoff, max)
	if err != nil {
		return 0, next, fmt.Errorf("sweep orphan blobs: %w", err)
	}
	var idList []string
	for _, k := range keys {
		if id, ok := blobAttachmentID(k); ok {
			idList = append(idList, id)
		}
	}
	if len(idList) == 0 {
		return 0, next, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT blob_key FROM attachments WHERE id = ANY($1::uuid[]) AND blob_key IS NOT NULL`, idList)
	if err != nil {
		return 0, next, fmt.Errorf("sweep orphan blobs: %w", err)
	}
	named, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, next, fmt.Errorf("sweep orphan blobs: %w", err)
	}
	keep := make(map[string]bool, len(named))
	for _, k := range named {
		keep[k] = true
	}
	deleted := 0
	var delErr error
	for _, k := range keys {
		if _, ok := blobAttachmentID(k); !ok || keep[k] {
			continue
		}
		if err := blobs.Delete(ctx, k); err != nil {
			if delErr == nil {
				delErr = fmt.Errorf("sweep orphan blobs: %w", err)
			}
			continue
		}
		deleted++
	}
	return deleted, next, delErr
}
