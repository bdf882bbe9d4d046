package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

// With HAN_DATABASE_DIRECT_URL unset, hanctl migrates over DATABASE_URL,
// which may go through PgBouncer in transaction pooling: a second migrator
// (another hanctl, or the gateway after the unit's `hanctl migrate`) must
// not meet the first one's prepared statements left on the server
// connection.
func TestMigrateTwiceThroughPgBouncer(t *testing.T) {
	b := testenv.BouncerFor(t, env)
	ctx := context.Background()
	direct, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "hanctl_bouncer_migrate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	vars := map[string]string{"DATABASE_URL": b.URL(direct, ""), "HAN_DB_EXEC_MODE": "exec"}
	for i := 1; i <= 2; i++ {
		out, err := run(t, vars, "migrate")
		if err != nil {
			t.Fatalf("hanctl migrate #%d through PgBouncer (HAN_DB_EXEC_MODE=exec, no HAN_DATABASE_DIRECT_URL): %q %v", i, out, err)
		}
	}
}

// `hanctl redis acl --out FILE` leaves FILE readable by its owner only
// (0600): it holds the digest of the api_backend password. Rendering over
// an existing world-readable file makes it private too.
func TestRedisACLOutFileIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users.acl")
	if err := os.WriteFile(path, []byte("user default off\n") /* a previous rendering */, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, map[string]string{"HAN_REDIS_API_PASSWORD": "acl-test-password"}, "redis", "acl", "--out", path)
	if err != nil {
		t.Fatalf("redis acl --out: %q %v", out, err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), "api_backend") {
		t.Fatalf("ACL file not written: %q %v", b, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("ACL file with the api_backend password digest has mode %v, the help promises 0600", fi.Mode().Perm())
	}
}

// Rendering over the ACL file Redis reads keeps the file's owner and group:
// run as root (the folder is Redis's), the render left a root-owned 0600
// file, and the next redis-server start (as its own user) could not read
// its ACL and failed.
func TestRedisACLOutFileKeepsItsOwner(t *testing.T) {
	// As root the file goes to nobody (as the redis user would own it);
	// otherwise it keeps this user and goes to another group of its own,
	// which a user may give its files.
	uid, gid := 65534, 65534
	if os.Geteuid() != 0 {
		uid, gid = os.Getuid(), -1
		groups, _ := os.Getgroups()
		for _, g := range groups {
			if g != os.Getgid() {
				gid = g
				break
			}
		}
		if gid < 0 {
			t.Skip("not root and in no second group: no owner or group to give the file that the render could lose")
		}
	}
	path := filepath.Join(t.TempDir(), "users.acl")
	if err := os.WriteFile(path, []byte("user default off\n") /* a previous rendering */, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, map[string]string{"HAN_REDIS_API_PASSWORD": "acl-test-password"}, "redis", "acl", "--out", path); err != nil {
		t.Fatalf("redis acl --out: %q %v", out, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ACL file owned by %d:%d mode %v, want %d:%d 0600", st.Uid, st.Gid, fi.Mode().Perm(), uid, gid)
	}
}
