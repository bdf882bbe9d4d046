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
// entry's key and type must already be valid. The writes are not one
// command: an import that fails part-way may have written some entries,
// and running it again writes the same fields again.
func ImportLegacyCache(ctx context.Context, rdb redis.UniversalClient, k Keys, entries []LegacyEntry, containerTTL time.Duration) error {
	if len(entries) == 0 {
		return errors.New("project: nothing to import")
	}
	exists := make([]*redis.IntCmd, len(entries))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			exists[i] = p.Exists(ctx, k.CacheEntry(e.Key))
		}
		return nil
	}); err != nil {
		return rds.ClassifyRedisError(err)
	}
	for i, c := range exists {
		if c.Val() > 0 {
			return fmt.Errorf("entry %d: %w", i, ErrLegacyKeyIsNormal)
		}
	}
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		var fields []any
		size := 0
		for i, e := range entries {
			b, err := json.Marshal(map[string]string{"type": e.Type, "value": e.Value})
			if err != nil {
				return err
			}
			fields = append(fields, e.Key, string(b))
			size += len(e.Key) + len(b)
			if size >= legacyImportChunkBytes || len(fields) >= 2*legacyImportChunkFields || i == len(entries)-1 {
				p.HSet(ctx, k.CacheContainer(), fields...)
				fields, size = nil, 0
			}
		}
		if containerTTL > 0 {
			p.PExpire(ctx, k.CacheContainer(), containerTTL)
		}
		return nil
	})
	return classifyProject(err)
}

// An import writes its entries in HSET commands of at most
// legacyImportChunkFields fields or about legacyImportChunkBytes each (one
// entry larger than that goes alone), all in one pipeline: Redis runs other
// clients' commands between them instead of one command of the whole file
// blocking it.
const (
	legacyImportChunkFields = 64
	legacyImportChunkBytes  = 1 << 20
)
