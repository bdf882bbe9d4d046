package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// Cutover removes every han:stub:* key and the legacy_stub user for good
// (ACL SAVE: it stays gone after a restart); verify fails before and passes
// after, and also fails on a han:* key without a TTL.
func TestRedisCutoverAndVerify(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-hanctl-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	vars := map[string]string{"HAN_REDIS_ADMIN_URL": rs.AdminURL(0)}

	// The stub's tasks in DB2, written as legacy_stub; application keys
	// with TTLs in DB0 and DB1, written as api_backend; one key without a
	// TTL.
	stubOpt, _ := redis.ParseURL(rs.LegacyStubURL(2))
	stub := redis.NewClient(stubOpt)
	defer stub.Close()
	for _, id := range []string{"t1", "t2", "t3"} {
		if _, err := store.CreateStubTask(ctx, stub, id, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for db, key := range map[int]string{0: "han:api:jwks:negative:abc", 1: "han:settings:snapshot:7"} {
		opt, _ := redis.ParseURL(rs.URL(db))
		c := redis.NewClient(opt)
		if err := c.Set(ctx, key, "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	admin1 := rs.AdminClient(1)
	defer admin1.Close()
	admin1.Set(ctx, "han:rt:orphan", "x", 0)

	out, err := run(t, vars, "redis", "verify")
	if err == nil {
		t.Fatalf("verify must fail before cutover:\n%s", out)
	}
	for _, want := range []string{"FAIL  no han:stub:* keys (3 found", "FAIL  no ACL user legacy_stub", "FAIL  legacy DB2 holds no keys (3)",
		"FAIL  every han:api:* han:rt:* han:coord:* han:settings:* key has a TTL (3 checked, 1 without): db1:han:rt:orphan"} {
		if !strings.Contains(out, want) {
			t.Fatalf("verify output lacks %q:\n%s", want, out)
		}
	}

	// An instance still connected as legacy_stub: refused, nothing deleted.
	if err := stub.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, vars, "redis", "cutover"); err == nil || !strings.Contains(err.Error(), "HAN_LEGACY_STUB_ENABLED=false") {
		t.Fatalf("cutover with a live stub connection: %v\n%s", err, out)
	}
	admin2 := rs.AdminClient(2)
	defer admin2.Close()
	if n := admin2.DBSize(ctx).Val(); n != 3 {
		t.Fatalf("a refused cutover deleted keys: %d left", n)
	}

	out, err = run(t, vars, "redis", "cutover", "--force")
	if err != nil {
		t.Fatalf("cutover: %v\n%s", err, out)
	}
	for _, want := range []string{"deleted 3 han:stub:* key(s)", "deleted ACL user legacy_stub", "ACL saved", "HAN_LEGACY_STUB_ENABLED and HAN_LEGACY_STUB_URL"} {
		if !strings.Contains(out, want) {
			t.Fatalf("cutover output lacks %q:\n%s", want, out)
		}
	}
	assertNoStub := func() {
		t.Helper()
		for db := 0; db < 3; db++ {
			c := rs.AdminClient(db)
			keys, _, err := c.Scan(ctx, 0, "han:stub:*", 1000).Result()
			c.Close()
			if err != nil || len(keys) != 0 {
				t.Fatalf("db%d still holds %v (%v)", db, keys, err)
			}
		}
		list, err := admin1.Do(ctx, "acl", "list").StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range list {
			if strings.Contains(l, "legacy_stub") {
				t.Fatalf("ACL LIST still has %q", l)
			}
		}
	}
	assertNoStub()
	// The stub's connection was closed with its user.
	if err := stub.Ping(ctx).Err(); err == nil {
		t.Fatal("a legacy_stub connection survived the cutover")
	}

	// verify still fails on the key without a TTL, and only on it.
	out, err = run(t, vars, "redis", "verify")
	if err == nil || strings.Count(out, "FAIL") != 1 || !strings.Contains(out, "db1:han:rt:orphan") {
		t.Fatalf("verify with one key lacking a TTL: %v\n%s", err, out)
	}
	admin1.Expire(ctx, "han:rt:orphan", time.Minute)
	out, err = run(t, vars, "redis", "verify")
	if err != nil || strings.Contains(out, "FAIL") || strings.Count(out, "ok  ") != 4 {
		t.Fatalf("verify after cutover: %v\n%s", err, out)
	}

	// Saved: the ACL file no longer has the user, and a restart keeps it
	// gone.
	acl, err := os.ReadFile(filepath.Join(rs.Dir, "users.acl"))
	if err != nil || strings.Contains(string(acl), "legacy_stub") || !strings.Contains(string(acl), "api_backend") {
		t.Fatalf("ACL file after cutover (%v):\n%s", err, acl)
	}
	if err := rs.Restart(); err != nil {
		t.Fatal(err)
	}
	assertNoStub()

	// Idempotent.
	out, err = run(t, vars, "redis", "cutover")
	if err != nil || !strings.Contains(out, "deleted 0 han:stub:* key(s)") || !strings.Contains(out, "already absent") {
		t.Fatalf("second cutover: %v\n%s", err, out)
	}
}

func TestRedisOpsNeedAnAdminURL(t *testing.T) {
	for _, sub := range []string{"cutover", "verify"} {
		if _, err := run(t, nil, "redis", sub); err == nil || !strings.Contains(err.Error(), "HAN_REDIS_ADMIN_URL") {
			t.Fatalf("redis %s without HAN_REDIS_ADMIN_URL: %v", sub, err)
		}
	}
	// api_backend is no admin: the command fails without echoing the URL.
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	_, err = run(t, map[string]string{"HAN_REDIS_ADMIN_URL": rs.URL(0)}, "redis", "verify")
	if err == nil || strings.Contains(err.Error(), rs.Password) {
		t.Fatalf("verify as api_backend: %v", err)
	}
}
