package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
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

// cutover --force is for instances still connected as legacy_stub: the
// user goes first, closing their connections, so the tasks they write while
// the cutover runs cannot survive it; when it reports success no
// han:stub:* key is left.
func TestRedisCutoverForceLeavesNoStubKeys(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-hanctl-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	stubOpt, _ := redis.ParseURL(rs.LegacyStubURL(2))
	stubOpt.MaxRetries = -1
	stub := redis.NewClient(stubOpt)
	defer stub.Close()
	for i := 0; i < 5000; i++ {
		if _, err := store.CreateStubTask(ctx, stub, fmt.Sprintf("old-%d", i), 3*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Instances still running with the stub on keep writing tasks while
	// the operator runs cutover --force.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if _, err := store.CreateStubTask(ctx, stub, fmt.Sprintf("live-%d-%d", w, i), 3*time.Minute); err == nil {
					written.Add(1)
				}
			}
		}(w)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return written.Load() > 0 }, "the live writers wrote nothing")
	out, err := run(t, map[string]string{"HAN_REDIS_ADMIN_URL": rs.AdminURL(0)}, "redis", "cutover", "--force")
	time.Sleep(200 * time.Millisecond) // the writers go on trying
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("cutover --force: %v\n%s", err, out)
	}
	admin := rs.AdminClient(2)
	defer admin.Close()
	if left := admin.DBSize(ctx).Val(); left != 0 {
		t.Fatalf("cutover --force reported success but %d han:stub:* key(s) are left in DB2:\n%s", left, out)
	}
	if !strings.Contains(out, "deleted ACL user legacy_stub") || strings.Index(out, "deleted ACL user") > strings.Index(out, "han:stub:* key(s)") {
		t.Fatalf("the user must go before the keys:\n%s", out)
	}
}

// An admin URL naming a replica (or a failover mid-cutover) is reported as
// such, before anything is changed, not as Redis being unavailable.
func TestRedisCutoverOnAReplicaSaysSo(t *testing.T) {
	ctx := context.Background()
	opts := testenv.RedisOptions{LegacyStubPassword: "stub-hanctl-password", AdminPassword: "admin-replica-pw"}
	master, err := testenv.StartRedis(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	replica, err := testenv.StartRedis(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Stop()
	stubOpt, _ := redis.ParseURL(master.LegacyStubURL(2))
	stub := redis.NewClient(stubOpt)
	if _, err := store.CreateStubTask(ctx, stub, "t1", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	stub.Close()
	ra := replica.AdminClient(0)
	defer ra.Close()
	ra.ConfigSet(ctx, "masteruser", testenv.AdminUser)
	ra.ConfigSet(ctx, "masterauth", "admin-replica-pw")
	if err := ra.Do(ctx, "replicaof", "127.0.0.1", fmt.Sprint(master.Port)).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(ra.Info(ctx, "replication").Val(), "master_link_status:up")
	}, "replica never synced")
	out, err := run(t, map[string]string{"HAN_REDIS_ADMIN_URL": replica.AdminURL(0)}, "redis", "cutover")
	if err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("cutover on a replica: %v\n%s", err, out)
	}
	// Nothing changed on the replica: its legacy_stub user is still there.
	users, _ := ra.Do(ctx, "acl", "users").StringSlice()
	if !strings.Contains(strings.Join(users, " "), "legacy_stub") {
		t.Fatalf("a refused cutover changed the replica's ACL: %v", users)
	}
	// A write refused by the replica keeps its error code, not its text.
	werr := redactErr(ra.Set(ctx, "han:stub:x", "secret-value", time.Minute).Err())
	if werr == nil || !strings.HasPrefix(werr.Error(), "READONLY") || strings.Contains(werr.Error(), "You can't") {
		t.Fatalf("a READONLY reply redacted as %v", werr)
	}
}

// serverReply is a Redis server's error reply, as the client returns it.
type serverReply string

func (e serverReply) Error() string { return string(e) }
func (serverReply) RedisError()     {}

// A server's refusal keeps its error code, which tells the operator what
// the server refused; the rest of the reply, which may quote keys or
// values, is never shown. Errors of the connection stay "unavailable".
func TestRedisServerErrorsKeepTheirCode(t *testing.T) {
	for reply, want := range map[string]string{
		"READONLY You can't write against a read only replica.":                          "READONLY: the server is a read-only replica",
		"MISCONF Redis is configured to save RDB snapshots, but it's currently unable":   "MISCONF: ",
		"BUSY Redis is busy running a script. You can only call SCRIPT KILL":             "BUSY: ",
		"NOPERM User admin has no permissions to run the 'unlink' command":               "NOPERM (",
		"WRONGTYPE Operation against a key holding the wrong kind of value secret-value": "WRONGTYPE (",
		"ERR Error running script secret-value":                                          "ERR (",
		"ERR unknown command 'acl', with args beginning with: secret-value":              "ERR unknown command",
	} {
		got := redactErr(fmt.Errorf("wrapped: %w", serverReply(reply))).Error()
		if !strings.HasPrefix(got, want) || strings.Contains(got, "secret-value") || strings.Contains(got, "admin") {
			t.Errorf("%q redacted as %q, want it to start with %q and quote nothing", reply, got, want)
		}
	}
	for _, e := range []error{context.DeadlineExceeded, errors.New("dial tcp 127.0.0.1:1: connect: connection refused"),
		serverReply("lower-case reply secret-value")} {
		if got := redactErr(e); !errors.Is(got, rds.ErrRedisUnavailable) {
			t.Errorf("%v redacted as %v, want redis unavailable", e, got)
		}
	}
}
