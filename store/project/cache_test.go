package project_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// cacheEnv is a project cache on the shared test Redis and the keys of a
// project of its own.
func cacheEnv(t *testing.T) (*project.Cache, project.Keys, redis.UniversalClient) {
	t.Helper()
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return project.NewCache(rdb), project.NewKeys("cachetest", ids.New()), rdb
}

// The snapshot's usage and entry count describe exactly the entries not yet
// past their deadline, however many expired ones no write has forgotten
// yet. The state script accounts for a bounded number of them (1000) per
// call; with more waiting it used to subtract the sizes of only 1000 but
// every one from the count, reporting no entries yet a usage above zero.
func TestCacheStateExactWithManyExpiredEntries(t *testing.T) {
	ctx := context.Background()
	cache, keys, _ := cacheEnv(t)
	m := project.Mirror{CacheQuotaBytes: 1 << 20}
	put := func(key string, ttl time.Duration) int64 {
		t.Helper()
		res, err := cache.Put(ctx, keys, m, project.CachePut{Key: key, Type: "string", Value: "0123456789", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return res.Item.SizeBytes
	}
	var live int64
	for i := range 3 {
		live += put("live"+strconv.Itoa(i), time.Hour)
	}
	const expiring = 1100 // more than the state script accounts for in one call
	for i := range expiring {
		put("k"+strconv.Itoa(i), time.Second)
	}
	time.Sleep(1100 * time.Millisecond) // every short-lived entry is past its deadline
	st, err := cache.State(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 3 || st.UsageBytes != live {
		t.Fatalf("with %d entries past their deadline, State reports entries=%d usageBytes=%d; want 3 and %d",
			expiring, st.Entries, st.UsageBytes, live)
	}
}

// A cache PUT passes the metadata it read from PostgreSQL at its start; a
// settings change may commit, and write its mirror, before the PUT's script
// runs. The script used to write the values it was given over the mirror,
// rewinding the change in Redis, and never compared the item with the
// quota it rewound. Now the request's values only create the mirror (a new
// project, an empty Redis restore), and the item must fit the mirrored
// quota as well.
func TestCachePutKeepsTheMirroredSettings(t *testing.T) {
	ctx := context.Background()
	cache, keys, rdb := cacheEnv(t)
	mirror := func() []any {
		t.Helper()
		got, err := rdb.HMGet(ctx, keys.Meta(), "quota", "paused", "legacyDeadline").Result()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	item := func(key string, size int) project.CachePut {
		return project.CachePut{Key: key, Type: "string", Value: string(make([]byte, size-len(key))), TTL: time.Minute}
	}
	before := project.Mirror{CacheQuotaBytes: 1 << 20} // what each PUT read at its start
	if res, err := cache.Put(ctx, keys, before, item("first", 100)); err != nil || res.MirrorDiffers {
		t.Fatalf("the first PUT of a project: %v (mirror differs: %v)", err, res.MirrorDiffers)
	}
	if got := mirror(); got[0] != "1048576" || got[1] != "0" || got[2] != "0" {
		t.Fatalf("the first PUT of a project created the mirror %v, want the values it was given", got)
	}

	after := project.Mirror{CacheQuotaBytes: 64, DeliveryPaused: true, LegacyDeadlineMs: 1_900_000_000_000}
	if err := cache.SyncMeta(ctx, keys, after); err != nil { // the settings change, committed
		t.Fatal(err)
	}
	if res, err := cache.Put(ctx, keys, before, item("small", 64)); err != nil || !res.MirrorDiffers {
		t.Fatalf("an item within both quotas: %v (mirror differs: %v, want true)", err, res.MirrorDiffers)
	}
	if got := mirror(); got[0] != "64" || got[1] != "1" || got[2] != "1900000000000" {
		t.Fatalf("mirror after a PUT that read the settings before their change: %v, PostgreSQL holds quota=64 paused=1", got)
	}
	if _, err := cache.Put(ctx, keys, before, item("large", 65)); !errors.Is(err, project.ErrCacheQuotaExceeded) {
		t.Fatalf("an item above the mirrored quota (below the one the request read): %v, want the quota refusal", err)
	}
	if n := rdb.Exists(ctx, keys.CacheEntry("large")).Val(); n != 0 {
		t.Fatal("the refused item was written")
	}
}
