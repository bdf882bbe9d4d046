package rds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

func apiClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func isNoPerm(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOPERM") }

func TestACLAllowsOnlyTheServicePrefixes(t *testing.T) {
	ctx := context.Background()
	c := apiClient(t, env.Redis.URL(0))
	for _, k := range []string{"han:api:x", "han:rt:x", "han:coord:x", "han:settings:x", "han:prj:{dev:p}:x"} {
		if err := c.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Errorf("SET %s: %v", k, err)
		}
		if err := c.Get(ctx, k).Err(); err != nil {
			t.Errorf("GET %s: %v", k, err)
		}
	}
	for _, k := range []string{"han:stub:task:{1}", "safety:x", "other", "han:apix"} {
		if err := c.Set(ctx, k, "v", 0).Err(); !isNoPerm(err) {
			t.Errorf("SET %s: want NOPERM, got %v", k, err)
		}
		if err := c.Get(ctx, k).Err(); !isNoPerm(err) {
			t.Errorf("GET %s: want NOPERM, got %v", k, err)
		}
	}
	if err := c.Publish(ctx, "han:rt:dialog:1", "x").Err(); err != nil {
		t.Errorf("PUBLISH han:rt:*: %v", err)
	}
	if err := c.Publish(ctx, "safety:events", "x").Err(); !isNoPerm(err) {
		t.Errorf("PUBLISH outside han:rt:*: want NOPERM, got %v", err)
	}
	denied := [][]any{
		{"flushall"}, {"flushdb"}, {"config", "get", "maxmemory"}, {"config", "set", "maxmemory", "1"},
		{"keys", "*"}, {"client", "list"}, {"client", "kill", "type", "pubsub"}, {"acl", "list"},
		{"replicaof", "no", "one"}, {"shutdown"}, {"script", "flush"}, {"monitor"}, {"save"},
		// Server-wide scripting: a debugger that freezes every client
		// (SYNC), another application's scripts and function libraries.
		{"script", "debug", "sync"}, {"script", "debug", "yes"}, {"script", "kill"},
		{"function", "flush"}, {"function", "delete", "otherapp"}, {"function", "kill"},
		{"function", "load", "replace", "#!lua name=otherapp\nredis.register_function('f', function() return 1 end)"},
		{"function", "restore", "x"},
	}
	for _, cmd := range denied {
		if err := c.Do(ctx, cmd...).Err(); !isNoPerm(err) {
			t.Errorf("%v: want NOPERM, got %v", cmd, err)
		}
	}
	// What the service needs beyond @read/@write: TIME in scripts, INFO for
	// the eviction-policy gate, SCAN for the TTL audit and sizing.
	if err := c.Time(ctx).Err(); err != nil {
		t.Errorf("TIME: %v", err)
	}
	if err := c.Info(ctx, "memory").Err(); err != nil {
		t.Errorf("INFO memory: %v", err)
	}
	if err := c.Scan(ctx, 0, "han:*", 10).Err(); err != nil {
		t.Errorf("SCAN: %v", err)
	}
	if err := c.Eval(ctx, "return redis.call('TIME')", nil).Err(); err != nil {
		t.Errorf("TIME inside a script: %v", err)
	}
}

func TestDefaultUserIsDisabled(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: env.Redis.Addr(), MaxRetries: -1})
	defer c.Close()
	err := c.Ping(context.Background()).Err()
	if err == nil || !(strings.Contains(err.Error(), "NOAUTH") || strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "NOPERM")) {
		t.Fatalf("the default user must be off, PING gave %v", err)
	}
}

func TestSelectAllowedOnlyWhenDBsShareAnInstance(t *testing.T) {
	ctx := context.Background()
	// Shared instance (this package's server): the DB1 URL works.
	if err := apiClient(t, env.Redis.URL(1)).Ping(ctx).Err(); err != nil {
		t.Fatalf("DB1 on a shared instance: %v", err)
	}
	sep, err := testenv.StartRedis(testenv.RedisOptions{SeparateInstances: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sep.Stop()
	if err := apiClient(t, sep.URL(0)).Ping(ctx).Err(); err != nil {
		t.Fatalf("DB0 URL on a separate instance: %v", err)
	}
	c := apiClient(t, sep.URL(0))
	if err := c.Do(ctx, "select", "1").Err(); !isNoPerm(err) {
		t.Fatalf("SELECT on a separate instance: want NOPERM, got %v", err)
	}
}

func TestRenderACLNeverHoldsThePassword(t *testing.T) {
	text := rds.RenderACL(rds.ACLOptions{APIBackendPassword: "s3cret-password", LegacyStubPassword: "stub-password"})
	if strings.Contains(text, "s3cret-password") || strings.Contains(text, "stub-password") {
		t.Fatal("the ACL file must store password digests only")
	}
	for _, want := range []string{"user default off", "~han:api:*", "&han:rt:*", "+time", "+info", "-@dangerous", "user legacy_stub on", "~han:stub:*"} {
		if !strings.Contains(text, want) {
			t.Errorf("ACL lacks %q", want)
		}
	}
	if strings.Contains(rds.APIBackendRule("p", false), "-select") || !strings.Contains(rds.APIBackendRule("p", true), "-select") {
		t.Error("-select must appear exactly when DB0 and DB1 are separate instances")
	}
}

// legacy_stub runs scripts as api_backend does, and is denied the same
// server-wide scripting: flushing every client's script cache, another
// application's functions, the debugger that freezes the server.
func TestLegacyStubCannotTouchServerWideScripting(t *testing.T) {
	ctx := context.Background()
	s, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := apiClient(t, s.LegacyStubURL(2))
	for _, cmd := range [][]any{{"script", "flush"}, {"script", "debug", "sync"}, {"script", "kill"}, {"function", "flush"}, {"function", "kill"}} {
		if err := c.Do(ctx, cmd...).Err(); !isNoPerm(err) {
			t.Errorf("legacy_stub %v: want NOPERM, got %v", cmd, err)
		}
	}
	if err := c.Eval(ctx, "return redis.call('TIME')", nil).Err(); err != nil {
		t.Errorf("legacy_stub EVAL: %v", err)
	}
}
