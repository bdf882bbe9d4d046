package lua_test

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

func init() {
	rl := func(s *lua.Script, key string) func(ctx context.Context, c redis.Scripter) error {
		return func(ctx context.Context, c redis.Scripter) error {
			return s.Run(ctx, c, []string{key, key + ":dialog"}, "req-1", 10, 1000, 10, 5, 1000, 10).Err()
		}
	}
	invocations["ratelimit_sliding"] = rl(lua.RateLimitSliding, "han:api:rl:user:acl:rh:s1000")
	invocations["ratelimit_fixed"] = rl(lua.RateLimitFixed, "han:api:rl:user:acl:rh:f1000")
	invocations["ratelimit_bucket"] = rl(lua.RateLimitBucket, "han:api:rl:user:acl:rh:b1000")
	invocations["ratelimit_refund"] = func(ctx context.Context, c redis.Scripter) error {
		for _, a := range []string{"sliding", "fixed", "bucket"} {
			key := "han:api:rl:user:acl:rh:" + a[:1] + "1000"
			if err := lua.RateLimitRefund.Run(ctx, c, []string{key}, a, "req-1", 1000, 10, 0, 10).Err(); err != nil {
				return err
			}
		}
		return nil
	}
}
