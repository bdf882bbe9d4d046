package lua_test

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// The project cache scripts as api_backend, on one project's keys.
func init() {
	p := "han:prj:{acl:00000000-0000-7000-8000-000000000001}:"
	five := []string{p + "meta", p + "cache:idx", p + "cache:exp", p + "cache:sz", p + "cache"}
	six := append(append([]string{}, five...), p+"cache:e:k")
	invocations["project/cache_put"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectCachePut.Run(ctx, c, six, "k", "string", "v", 60000, 0, 2, 1048576, 0, 0, 16).Err()
	}
	invocations["project/cache_delete"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectCacheDelete.Run(ctx, c, six, "k", 0, 16).Err()
	}
	invocations["project/cache_prune"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectCachePrune.Run(ctx, c, five, 0, 16, "k", 1).Err()
	}
	invocations["project/cache_state"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectCacheState.Run(ctx, c, five, 1000).Err()
	}
	invocations["project/meta_sync"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectMetaSync.Run(ctx, c, five[:4], 1048576, 0, 0).Err()
	}
}
