package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
)

// The runbook's own procedure: render the ACL file with `hanctl redis acl
// --out /etc/redis/users.acl` (deploy/redis.conf; cutover step 5) and load
// it (`ACL LOAD`, or the next restart). The admin user the runbook uses for
// every check (`HAN_REDIS_ADMIN_URL … hanctl redis verify`, CONFIG SET,
// masteruser replication on a cluster) is in the file already and must
// still be there: api_backend cannot ACL LOAD, so losing it takes a hand
// edit and a Redis restart to undo.
func TestRenderedACLKeepsTheAdminUser(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	vars := map[string]string{"REDIS_URL": rs.URL(0), "REDIS_REALTIME_URL": rs.URL(1), "HAN_REDIS_ADMIN_URL": rs.AdminURL(0)}

	// Before: the runbook's check passes with the admin.
	if out, err := run(t, vars, "redis", "verify"); err != nil {
		t.Fatalf("verify before the render: %v\n%s", err, out)
	}
	// Render over the server's ACL file, as deploy/redis.conf says, and load it.
	out, err := run(t, vars, "redis", "acl", "--out", filepath.Join(rs.Dir, "users.acl"))
	if err != nil {
		t.Fatalf("redis acl --out: %v %s", err, out)
	}
	if !strings.Contains(out, "kept from the file replaced: "+testenv.AdminUser) {
		t.Errorf("redis acl --out does not say which users it kept: %q", out)
	}
	admin := rs.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "load").Err(); err != nil {
		t.Fatalf("ACL LOAD: %v", err)
	}
	// After: the same check, as the runbook runs it after any intervention.
	if out, err := run(t, vars, "redis", "verify"); err != nil {
		users, _ := rs.AdminClient(0).Do(ctx, "acl", "users").Result()
		t.Fatalf("after rendering the ACL file with hanctl and loading it, the admin is locked out: "+
			"hanctl redis verify: %v (ACL USERS as admin: %v)\n%s", err, users, out)
	}
}

// --admin-user renders an administrator whose password comes from the
// environment (never a flag, which the process list shows) and is stored
// as a digest; it can run the admin commands, reload the file and sign in
// to replicate. Rendering again replaces its line instead of adding one.
func TestRedisACLAdminUser(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	const pw = "ops-admin-Zq9-password"
	file := filepath.Join(rs.Dir, "users.acl")
	vars := map[string]string{"REDIS_URL": rs.URL(0), "REDIS_REALTIME_URL": rs.URL(1), "HAN_REDIS_ADMIN_PASSWORD": pw}
	for i := 0; i < 2; i++ {
		if out, err := run(t, vars, "redis", "acl", "--admin-user", "ops_admin", "--out", file); err != nil {
			t.Fatalf("redis acl --admin-user #%d: %v %s", i, err, out)
		}
	}
	data, _ := os.ReadFile(file)
	if bytes.Contains(data, []byte(pw)) || bytes.Count(data, []byte("user ops_admin on #")) != 1 ||
		bytes.Count(data, []byte("user "+testenv.AdminUser+" ")) != 1 {
		t.Fatalf("want one ops_admin line with a digest, one %s line kept, no clear password:\n%s", testenv.AdminUser, data)
	}
	if err := rs.AdminClient(0).Do(ctx, "acl", "load").Err(); err != nil {
		t.Fatalf("ACL LOAD: %v", err)
	}
	ops := redis.NewClient(&redis.Options{Addr: rs.Addr(), Username: "ops_admin", Password: pw})
	defer ops.Close()
	for _, cmd := range [][]any{{"acl", "load"}, {"config", "get", "maxmemory-policy"}, {"set", "any:key", "1"}, {"publish", "any:channel", "x"}} {
		if err := ops.Do(ctx, cmd...).Err(); err != nil {
			t.Errorf("ops_admin %v: %v", cmd, err)
		}
	}
	vars["HAN_REDIS_ADMIN_URL"] = fmt.Sprintf("redis://ops_admin:%s@%s/0", pw, rs.Addr())
	if out, err := run(t, vars, "redis", "verify"); err != nil {
		t.Fatalf("verify as ops_admin: %v\n%s", err, out)
	}

	// The password may come from HAN_REDIS_ADMIN_URL when its user is that name.
	delete(vars, "HAN_REDIS_ADMIN_PASSWORD")
	if out, err := run(t, vars, "redis", "acl", "--admin-user", "ops_admin"); err != nil || !strings.Contains(out, "user ops_admin on #") {
		t.Fatalf("password from HAN_REDIS_ADMIN_URL: %v\n%s", err, out)
	}
	for _, name := range []string{"other_admin", "api_backend", "default", "legacy_stub", "two words"} {
		if out, err := run(t, vars, "redis", "acl", "--admin-user", name); err == nil {
			t.Errorf("--admin-user %q without its password or with a name hanctl renders: accepted\n%s", name, out)
		}
	}
}

// A render that would drop a user of the file it replaces (legacy_stub,
// when HAN_LEGACY_STUB_PASSWORD was forgotten before cutover) writes
// nothing unless --force; so does a file Redis would refuse to load.
func TestRedisACLRefusesToDropAUser(t *testing.T) {
	ctx := context.Background()
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-password-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	file := filepath.Join(rs.Dir, "users.acl")
	before, _ := os.ReadFile(file)
	vars := map[string]string{"REDIS_URL": rs.URL(0), "REDIS_REALTIME_URL": rs.URL(1)}
	_, err = run(t, vars, "redis", "acl", "--out", file)
	if after, _ := os.ReadFile(file); err == nil || !strings.Contains(err.Error(), "legacy_stub") ||
		!strings.Contains(err.Error(), "--force") || !bytes.Equal(before, after) {
		t.Fatalf("a render dropping legacy_stub: %v (file changed: %v), want a refusal naming the user and --force", err, !bytes.Equal(before, after))
	}
	vars["HAN_LEGACY_STUB_PASSWORD"] = "stub-password-1"
	if _, err := run(t, vars, "redis", "acl", "--out", file); err != nil {
		t.Fatalf("with HAN_LEGACY_STUB_PASSWORD: %v", err)
	}
	delete(vars, "HAN_LEGACY_STUB_PASSWORD")
	if _, err := run(t, vars, "redis", "acl", "--out", file, "--force"); err != nil {
		t.Fatalf("--force: %v", err)
	}
	admin := rs.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "load").Err(); err != nil {
		t.Fatalf("ACL LOAD: %v", err)
	}
	// ACL LOAD closes the connections of the users it replaced: a new one.
	fresh := rs.AdminClient(0)
	defer fresh.Close()
	users, err := fresh.Do(ctx, "acl", "users").StringSlice()
	if strings.Join(users, " ") != "api_backend default "+testenv.AdminUser {
		t.Fatalf("after --force: users %v (%v), want api_backend, default and the admin", users, err)
	}

	bad := filepath.Join(t.TempDir(), "users.acl")
	if err := os.WriteFile(bad, []byte("user a on nopass ~* +@all\nnot a user line secret-xyz\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, vars, "redis", "acl", "--out", bad); err == nil || !strings.Contains(err.Error(), "line 2") ||
		strings.Contains(err.Error(), "secret-xyz") {
		t.Fatalf("a file with a line that is not a user: %v, want a refusal naming line 2 only", err)
	}
	if _, err := run(t, vars, "redis", "acl", "--out", bad, "--force"); err != nil {
		t.Fatalf("--force over a file with a line that is not a user: %v", err)
	}
}
