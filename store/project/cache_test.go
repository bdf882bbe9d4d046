package project_test

import (
	"context"
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
		it, _, err := cache.Put(ctx, keys, m, project.CachePut{Key: key, Type: "string", Value: "0123456789", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return it.SizeBytes
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
