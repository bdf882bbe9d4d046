package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Redis: true}, &env) }

func client(t *testing.T) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(env.Redis.URL(1))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// invocations runs every embedded script once as api_backend under the
// rendered ACL. A script without an entry fails the test, so a new script
// cannot skip the ACL check.
var invocations = map[string]func(ctx context.Context, c redis.Scripter) error{
	"lock_acquire": func(ctx context.Context, c redis.Scripter) error {
		return lua.LockAcquire.Run(ctx, c, []string{"han:coord:lock:acl:{t}", "han:coord:fence:acl:{t}"}, "owner", 30000, 86400000).Err()
	},
	"lock_extend": func(ctx context.Context, c redis.Scripter) error {
		return lua.LockExtend.Run(ctx, c, []string{"han:coord:lock:acl:{t}"}, "owner", 30000).Err()
	},
	"lock_release": func(ctx context.Context, c redis.Scripter) error {
		return lua.LockRelease.Run(ctx, c, []string{"han:coord:lock:acl:{t}"}, "owner").Err()
	},
}

func TestEveryScriptRunsAsAPIBackend(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	for _, s := range lua.All() {
		run, ok := invocations[s.Name]
		if !ok {
			t.Errorf("script %s has no ACL invocation in this test", s.Name)
			continue
		}
		if err := run(ctx, c); err != nil {
			t.Errorf("script %s as api_backend: %v", s.Name, err)
		}
	}
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := lua.LoadAll(ctx, c); err != nil {
		t.Fatal(err)
	}
	// api_backend itself may not flush the cache: the ACL denies it.
	if err := c.ScriptFlush(ctx).Err(); err == nil {
		t.Fatal("api_backend must not be allowed SCRIPT FLUSH")
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	exists, err := admin.ScriptExists(ctx, lua.LockAcquire.Hash()).Result()
	if err != nil || exists[0] {
		t.Fatalf("script should be gone after SCRIPT FLUSH (%v)", err)
	}
	for name, run := range invocations {
		if err := run(ctx, c); err != nil {
			t.Fatalf("%s after SCRIPT FLUSH: %v", name, err)
		}
	}
	exists, _ = admin.ScriptExists(ctx, lua.LockAcquire.Hash()).Result()
	if !exists[0] {
		t.Fatal("Run should have reloaded the script")
	}
}

func TestLockScripts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	lock, fence := "han:coord:lock:delivery:{m1}", "han:coord:fence:delivery:{m1}"
	acquire := func(owner string, ttl int) []any {
		v, err := lua.LockAcquire.Run(ctx, c, []string{lock, fence}, owner, ttl, 86400000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	r := acquire("a", 30000)
	if r[0].(int64) != 1 || r[1].(int64) != 1 {
		t.Fatalf("first acquire: %v", r)
	}
	if r := acquire("b", 30000); r[0].(int64) != 0 || r[1].(int64) <= 0 {
		t.Fatalf("second owner must wait: %v", r)
	}
	if v, _ := lua.LockExtend.Run(ctx, c, []string{lock}, "b", 30000).Int(); v != 0 {
		t.Fatalf("a non-owner extended the lock: %d", v)
	}
	if v, _ := lua.LockRelease.Run(ctx, c, []string{lock}, "b").Int(); v != 0 {
		t.Fatalf("a non-owner released the lock: %d", v)
	}
	if v, _ := lua.LockRelease.Run(ctx, c, []string{lock}, "a").Int(); v != 1 {
		t.Fatalf("owner release: %d", v)
	}
	if r := acquire("b", 50); r[0].(int64) != 1 || r[1].(int64) != 2 {
		t.Fatalf("fencing token must increase: %v", r)
	}
	testenv.Eventually(t, 2*time.Second, func() bool { return c.Exists(ctx, lock).Val() == 0 }, "lock did not expire")
	// The late owner cannot release or extend what expired.
	if v, _ := lua.LockRelease.Run(ctx, c, []string{lock}, "b").Int(); v != -1 {
		t.Fatalf("release after expiry: %d", v)
	}
	if v, _ := lua.LockExtend.Run(ctx, c, []string{lock}, "b", 1000).Int(); v != -1 {
		t.Fatalf("extend after expiry: %d", v)
	}
	if ttl := c.PTTL(ctx, fence).Val(); ttl <= 0 {
		t.Fatalf("fence counter must carry a TTL, got %v", ttl)
	}
}
