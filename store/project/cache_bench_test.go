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

// BenchmarkProjectCache compares the project cache paths with the cheapest
// Redis calls that could store or read the same data, in the same run on
// the package's redis-server as api_backend: a PUT (one script: checks,
// entry, PEXPIREAT, index, usage, mirror) against a pipelined HSET +
// PEXPIREAT, and a 100-item page (state script + index range + pipelined
// metadata and value reads) against one pipeline of 100 HGETALLs.
//
//	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -bench BenchmarkProjectCache ./store/
func BenchmarkProjectCache(b *testing.B) {
	ctx := context.Background()
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	cache := project.NewCache(rdb)
	keys := project.NewKeys("bench", ids.New())
	m := project.Mirror{CacheQuotaBytes: 1 << 20}
	value := string(make([]byte, 256))
	const n = 100
	names := make([]string, n)
	for i := range names {
		names[i] = "key-" + strconv.Itoa(i)
	}

	b.Run("put/baseline-hset-pexpireat", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			k := keys.CacheEntry(names[i%n])
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, k, "t", "string", "v", value)
				p.PExpireAt(ctx, k, time.Now().Add(time.Hour))
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("put/script", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := cache.Put(ctx, keys, m, project.CachePut{Key: names[i%n], Type: "string", Value: value, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("page100/baseline-pipelined-hgetall", func(b *testing.B) {
		for b.Loop() {
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, name := range names {
					p.HGetAll(ctx, keys.CacheEntry(name))
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("page100/plan-and-read", func(b *testing.B) {
		for b.Loop() {
			page, err := cache.PlanPage(ctx, keys, m, project.CacheQuery{Limit: n, MaxValueBytes: 4 << 20})
			if err != nil {
				b.Fatal(err)
			}
			got := 0
			if err := cache.EachItem(ctx, keys, page, func(project.CacheItem) error { got++; return nil }); err != nil || got != n {
				b.Fatalf("%d items, %v", got, err)
			}
		}
	})
}
