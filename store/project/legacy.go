package project

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/store/rds"
)

// LegacyEntry is one cache entry in the legacy v1 format: a field of the
// project's cache container HASH whose value is {"type","value"}, without
// any per-field expiry (docs/project-redis-api.md).
type LegacyEntry struct {
	Key   string
	Type  string
	Value string
}

// ErrLegacyKeyIsNormal means an imported key already exists as a normal
// entry; legacy data predates normal entries, so that cannot be legacy.
var ErrLegacyKeyIsNormal = errors.New("project: key already exists as a normal cache entry")

// ImportLegacyCache writes entries into the project's legacy cache
// container exactly as the pre-upgrade service stored them (hanctl project
// legacy-import). containerTTL > 0 also gives the container a physical TTL
// (the "container with a TTL" case); zero leaves it without one. Each
// entry's key and type must already be valid.
//
// It first checks, in bounded pipelines, that no key exists as a normal
// entry (ErrLegacyKeyIsNormal, nothing written), then writes the entries in
// file order, one bounded pipeline after the other (the container's TTL
// set again in each). The writes are not one command: a failure to reach
// Redis is a *LegacyImportError saying how many entries were written
// before it. Running the import again writes the same fields with the same
// values, so a re-run of the file finishes one that failed part-way.
func ImportLegacyCache(ctx context.Context, rdb redis.UniversalClient, k Keys, entries []LegacyEntry, containerTTL time.Duration) error {
	if len(entries) == 0 {
		return errors.New("project: nothing to import")
	}
	for from := 0; from < len(entries); from += legacyCheckChunk {
		part := entries[from:min(from+legacyCheckChunk, len(entries))]
		exists := make([]*redis.IntCmd, len(part))
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, e := range part {
				exists[i] = p.Exists(ctx, k.CacheEntry(e.Key))
			}
			return nil
		}); err != nil {
			return legacyImportFailed("check entries", 0, err)
		}
		for i, c := range exists {
			if c.Val() > 0 {
				return fmt.Errorf("entry %d: %w", from+i, ErrLegacyKeyIsNormal)
			}
		}
	}
	written := 0
	for from := 0; from < len(entries); {
		fields, n, err := legacyChunk(entries[from:])
		if err != nil {
			return err
		}
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, k.CacheContainer(), fields...)
			if containerTTL > 0 {
				p.PExpire(ctx, k.CacheContainer(), containerTTL)
			}
			return nil
		}); err != nil {
			return legacyImportFailed("write entries", written, err)
		}
		from += n
		written += n
	}
	return nil
}

// legacyChunk is the HSET arguments of the first entries: at most
// legacyImportChunkFields of them, or about legacyImportChunkBytes (one
// entry larger than that goes alone); n is how many.
func legacyChunk(entries []LegacyEntry) (fields []any, n int, err error) {
	size := 0
	for _, e := range entries {
		b, err := json.Marshal(map[string]string{"type": e.Type, "value": e.Value})
		if err != nil {
			return nil, 0, err
		}
		fields = append(fields, e.Key, string(b))
		size += len(e.Key) + len(b)
		n++
		if size >= legacyImportChunkBytes || n >= legacyImportChunkFields {
			break
		}
	}
	return fields, n, nil
}

// LegacyImportError is ImportLegacyCache's failure to reach Redis, or to
// be answered. Step is "check entries" (nothing was written) or "write
// entries"; the first Written entries of the file were written before it
// (the pipeline that failed may have been applied in part too); TimedOut
// says Redis did not answer in time (the client's timeout or the context's
// deadline passed). Err is the failure's class (rds.ClassifyRedisError),
// without Redis's text.
type LegacyImportError struct {
	Step     string
	Written  int
	TimedOut bool
	Err      error
}

func (e *LegacyImportError) Error() string { return e.Step + ": " + e.Err.Error() }

func (e *LegacyImportError) Unwrap() error { return e.Err }

func legacyImportFailed(step string, written int, err error) error {
	return &LegacyImportError{Step: step, Written: written, TimedOut: rds.Kind(err) == "timeout", Err: classifyProject(err)}
}

// An import writes its entries in HSET commands of at most
// legacyImportChunkFields fields or about legacyImportChunkBytes each (one
// entry larger than that goes alone), each in its own round trip: Redis runs
// other clients' commands between them instead of one command of the whole
// file blocking it, and no request to Redis carries more than about a MiB
// (or one larger entry), so a client timeout suited to that bounds each.
// The check for normal entries asks about legacyCheckChunk keys at a time.
const (
	legacyImportChunkFields = 64
	legacyImportChunkBytes  = 1 << 20
	legacyCheckChunk        = 1024
)
