package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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
	if err := os.WriteFile(path, []byte("# previous rendering\n"), 0o644); err != nil {
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
