package lua_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

const stubPassword = "stub-lua-test-password"

// legacyStub adds the legacy_stub user to the package's server exactly as
// rds.RenderACL renders it (so the rendered rule is what is proven to
// suffice) and returns a client of DB2 as legacy_stub; the caller closes it.
func legacyStub(ctx context.Context, rs *testenv.RedisServer) (*redis.Client, error) {
	var rule []string
	for _, line := range strings.Split(rds.RenderACL(rds.ACLOptions{APIBackendPassword: "x", LegacyStubPassword: stubPassword}), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "user" && f[1] == rds.LegacyStubUser {
			rule = f[1:]
		}
	}
	if rule == nil {
		return nil, errors.New("RenderACL rendered no legacy_stub user")
	}
	admin := rs.AdminClient(0)
	defer admin.Close()
	args := []any{"acl", "setuser"}
	for _, f := range rule {
		args = append(args, f)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		return nil, err
	}
	return redis.NewClient(&redis.Options{Addr: rs.Addr(), Username: rds.LegacyStubUser, Password: stubPassword, DB: 2}), nil
}

// runAsStub runs a stub script as legacy_stub, and proves that api_backend
// (c) gets NOPERM on the same call: api_backend has no access to han:stub:*.
func runAsStub(ctx context.Context, c redis.Scripter, run func(c redis.Scripter) error) error {
	if err := run(c); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		return fmt.Errorf("api_backend must get NOPERM on han:stub:*, got %v", err)
	}
	sc, err := legacyStub(ctx, env.Redis)
	if err != nil {
		return err
	}
	defer sc.Close()
	return run(sc)
}

func init() {
	key := "han:stub:task:{acl}"
	invocations["stub_task_create"] = func(ctx context.Context, c redis.Scripter) error {
		return runAsStub(ctx, c, func(c redis.Scripter) error {
			return lua.StubTaskCreate.Run(ctx, c, []string{key}, 180000).Err()
		})
	}
	invocations["stub_task_poll"] = func(ctx context.Context, c redis.Scripter) error {
		return runAsStub(ctx, c, func(c redis.Scripter) error {
			err := lua.StubTaskPoll.Run(ctx, c, []string{key}, 3, "approved").Err()
			if errors.Is(err, redis.Nil) {
				return nil
			}
			return err
		})
	}
}

func TestStubTaskScripts(t *testing.T) {
	ctx := context.Background()
	c, err := legacyStub(ctx, env.Redis)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := "han:stub:task:{t1}"
	create := func() []any {
		v, err := lua.StubTaskCreate.Run(ctx, c, []string{key}, 180000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if r := create(); r[0].(int64) != 1 {
		t.Fatalf("create: %v", r)
	}
	h := c.HGetAll(ctx, key).Val()
	if h["state"] != "pending" || h["polls"] != "0" || h["verdict"] != "" || h["created_ms"] == "" || len(h) != 4 {
		t.Fatalf("task HASH: %v", h)
	}
	ttl := c.PTTL(ctx, key).Val().Milliseconds()
	if ttl <= 170000 || ttl > 180000 {
		t.Fatalf("task TTL %d ms, want about 180000", ttl)
	}
	// A repeated create leaves the task as it is.
	c.HSet(ctx, key, "polls", 2)
	if r := create(); r[0].(int64) != 0 || c.HGet(ctx, key, "polls").Val() != "2" {
		t.Fatalf("a second create must not reset the task: %v %v", r, c.HGetAll(ctx, key).Val())
	}
	c.HSet(ctx, key, "polls", 0)

	poll := func(verdict string) []any {
		v, err := lua.StubTaskPoll.Run(ctx, c, []string{key}, 3, verdict).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i := 1; i <= 2; i++ {
		if r := poll("rejected"); r[0] != "pending" || r[1].(int64) != int64(i) || r[2] != "" {
			t.Fatalf("poll %d: %v", i, r)
		}
	}
	if r := poll("rejected"); r[0] != "done" || r[1].(int64) != 3 || r[2] != "rejected" {
		t.Fatalf("third poll must decide: %v", r)
	}
	// Later polls keep the first verdict, whatever the caller drew.
	if r := poll("approved"); r[0] != "done" || r[1].(int64) != 4 || r[2] != "rejected" {
		t.Fatalf("verdict must stick: %v", r)
	}
	if after := c.PTTL(ctx, key).Val().Milliseconds(); after <= 0 || after > ttl {
		t.Fatalf("polls must keep the task's TTL: %d (was %d)", after, ttl)
	}

	// A missing task: nil, and nothing written.
	if err := lua.StubTaskPoll.Run(ctx, c, []string{"han:stub:task:{missing}"}, 3, "approved").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("poll of a missing task: %v", err)
	}
	if n := c.Exists(ctx, "han:stub:task:{missing}").Val(); n != 0 {
		t.Fatal("a poll created a task")
	}
	// Bad arguments are refused before any write.
	if err := lua.StubTaskPoll.Run(ctx, c, []string{key}, 0, "approved").Err(); err == nil {
		t.Fatal("polls before a verdict must be >= 1")
	}
	if err := lua.StubTaskPoll.Run(ctx, c, []string{key}, 3, "maybe").Err(); err == nil {
		t.Fatal("an unknown verdict must be refused")
	}
	if err := lua.StubTaskCreate.Run(ctx, c, []string{"han:stub:task:{bad}"}, 0).Err(); err == nil || c.Exists(ctx, "han:stub:task:{bad}").Val() != 0 {
		t.Fatalf("a zero TTL must be refused with nothing written: %v", err)
	}
	if v := c.HGet(ctx, key, "polls").Val(); v != "4" {
		t.Fatalf("refused polls counted: polls=%s", v)
	}
}

// The create script refuses to write when legacy_stub may not set the
// task's expiry: a task without a TTL would outlive the stub.
func TestStubTaskCreateRefusesWithoutExpiry(t *testing.T) {
	ctx := context.Background()
	r, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: stubPassword})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	admin := r.AdminClient(2)
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "setuser", rds.LegacyStubUser, "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(r.LegacyStubURL(2))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	err = lua.StubTaskCreate.Run(ctx, c, []string{"han:stub:task:{x}"}, 180000).Err()
	if !errors.Is(rds.ClassifyRedisError(err), rds.ErrExpiryDenied) {
		t.Fatalf("want expiry_denied, got %v", err)
	}
	if n := admin.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("a refused create wrote %d keys", n)
	}
}
