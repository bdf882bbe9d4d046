package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// help_test.go runs the real main() as a child process this way.
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	testenv.Main(m, testenv.Options{Postgres: true}, &env)
}

const secret = "hanctl-test-secret-0123456789abcdef"

func getenv(extra map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := extra[k]; ok {
			return v
		}
		switch k {
		case "DATABASE_URL":
			return env.DatabaseURL
		case "HAN_JWT_DEV_HS256_SECRET":
			return secret
		}
		return ""
	}
}

func run(t *testing.T, extra map[string]string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Run(context.Background(), args, getenv(extra), &out)
	return out.String(), err
}

func verifier(t *testing.T) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: []byte(secret)}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMigrateTwice(t *testing.T) {
	out, err := run(t, nil, "migrate")
	if err != nil || !strings.Contains(out, "0001_init") {
		if !strings.Contains(out, "up to date") {
			t.Fatalf("first migrate: %q %v", out, err)
		}
	}
	out, err = run(t, nil, "migrate")
	if err != nil || !strings.Contains(out, "up to date") {
		t.Fatalf("second migrate: %q %v", out, err)
	}
}

func TestToken(t *testing.T) {
	sub := ids.New()
	out, err := run(t, nil, "token", "--sub", strings.ToUpper(sub), "--typ", "service", "--svc", "billing", "--ttl", "5m")
	if err != nil {
		t.Fatal(err)
	}
	p, err := verifier(t).Verify(context.Background(), strings.TrimSpace(out))
	if err != nil || p.UserID != sub || p.Kind != auth.KindService || p.Service != "billing" {
		t.Fatalf("minted token: %+v %v", p, err)
	}
	if _, err := run(t, nil, "token", "--sub", "not-a-uuid"); err == nil {
		t.Fatal("a non-UUID subject must be refused")
	}
	if _, err := run(t, map[string]string{"HAN_ENV": "prod"}, "token", "--sub", sub); err == nil {
		t.Fatal("dev tokens must be refused in prod")
	}
	if _, err := run(t, map[string]string{"HAN_JWT_DEV_HS256_SECRET": ""}, "token", "--sub", sub); err == nil {
		t.Fatal("a missing secret must be an error")
	}
}

func TestProjectCreateAndSeed(t *testing.T) {
	if _, err := run(t, nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	u := ids.New()
	pid := ids.New()
	out, err := run(t, nil, "project", "create", "--name", "Acme", "--id", pid, "--member", u+":read")
	if err != nil || strings.TrimSpace(out) != pid {
		t.Fatalf("project create: %q %v", out, err)
	}
	for i := 0; i < 2; i++ { // --update may repeat
		out, err := run(t, nil, "project", "create", "--name", "Acme", "--id", pid, "--member", u+":write", "--update")
		if err != nil || strings.TrimSpace(out) != pid {
			t.Fatalf("project create --update #%d: %q %v", i, out, err)
		}
	}
	if _, err := run(t, nil, "project", "create", "--name", "Acme", "--member", u+":owner"); err == nil {
		t.Fatal("an invalid role must be refused")
	}
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := store.New(pool)
	if role, err := st.ProjectRole(ctx, pid, u); err != nil || role != "write" {
		t.Fatalf("member role: %q %v", role, err)
	}

	var first demoOut
	for i := 0; i < 2; i++ {
		out, err := run(t, nil, "seed", "demo")
		if err != nil {
			t.Fatalf("seed #%d: %v", i, err)
		}
		var d demoOut
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("seed output is not JSON: %v", err)
		}
		if i == 0 {
			first = d
		} else if d.DialogID != first.DialogID || d.ProjectID != first.ProjectID {
			t.Fatal("seeding twice must reuse the same demo ids")
		}
	}
	p, err := verifier(t).Verify(ctx, first.Tokens["alice"])
	if err != nil || p.UserID != first.Users["alice"] {
		t.Fatalf("alice's token: %v", err)
	}
	dlg, err := st.DialogForMember(ctx, first.DialogID, first.Users["bob"])
	if err != nil || len(dlg.MemberIDs) != 2 {
		t.Fatalf("demo dialog: %+v %v", dlg, err)
	}
	if role, _ := st.ProjectRole(ctx, first.ProjectID, first.Users["alice"]); role != "admin" {
		t.Fatalf("alice should administer the demo project, has %q", role)
	}
}

func TestRedisACL(t *testing.T) {
	shared := map[string]string{
		"REDIS_URL":          "redis://api_backend:pw-123@10.0.0.5:6379/0",
		"REDIS_REALTIME_URL": "redis://api_backend:pw-123@10.0.0.5:6379/1",
	}
	out, err := run(t, shared, "redis", "acl")
	if err != nil || strings.Contains(out, "pw-123") || !strings.Contains(out, "user api_backend on #") || strings.Contains(out, "-select") {
		t.Fatalf("shared-instance ACL: %v\n%s", err, out)
	}
	split := map[string]string{
		"REDIS_URL":          "redis://api_backend:pw-123@10.0.0.5:6379/0",
		"REDIS_REALTIME_URL": "redis://api_backend:pw-123@10.0.0.6:6379/0",
	}
	out, err = run(t, split, "redis", "acl")
	if err != nil || !strings.Contains(out, "-select") {
		t.Fatalf("separate instances must deny SELECT: %v\n%s", err, out)
	}
	if _, err := run(t, nil, "redis", "acl"); err == nil {
		t.Fatal("no password anywhere must be an error")
	}
	for _, c := range []struct {
		env  map[string]string
		args []string
	}{
		{shared, []string{"redis", "acl", "--cluster"}},
		{map[string]string{
			"REDIS_URL":          "redis://api_backend:pw-123@10.0.0.5:6379?addr=10.0.0.6:6379&addr=10.0.0.7:6379",
			"REDIS_REALTIME_URL": "redis://api_backend:pw-123@10.0.0.8:6379/1",
		}, []string{"redis", "acl"}},
	} {
		out, err = run(t, c.env, c.args...)
		if err != nil || strings.Contains(out, "pw-123") || !strings.Contains(out, "+cluster|slots +cluster|shards") || !strings.Contains(out, "-select") {
			t.Fatalf("cluster ACL (%v): %v\n%s", c.args, err, out)
		}
	}
	if out, _ = run(t, shared, "redis", "acl"); strings.Contains(out, "cluster|") {
		t.Fatalf("a standalone ACL must not grant cluster commands:\n%s", out)
	}
}

func TestUnknownCommand(t *testing.T) {
	if _, err := run(t, nil, "frobnicate"); err == nil {
		t.Fatal("unknown command must fail")
	}
}

// hanctl connects over HAN_DATABASE_DIRECT_URL when it is set: DATABASE_URL
// may name a transaction-pooling proxy (here: nothing listens there at all).
func TestMigrateUsesTheDirectURL(t *testing.T) {
	out, err := run(t, map[string]string{
		"DATABASE_URL":            "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=1",
		"HAN_DATABASE_DIRECT_URL": env.DirectURL,
	}, "migrate")
	if err != nil || !(strings.Contains(out, "up to date") || strings.Contains(out, "applied")) {
		t.Fatalf("migrate over the direct URL: %q %v", out, err)
	}
}

// A PostgreSQL that does not answer is named by the variable hanctl used,
// so the operator checks the right one.
func TestUnreachableDatabaseNamesTheVariableUsed(t *testing.T) {
	nowhere := "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=1"
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DATABASE_URL": env.DirectURL, "HAN_DATABASE_DIRECT_URL": nowhere}, "at HAN_DATABASE_DIRECT_URL"},
		{map[string]string{"DATABASE_URL": nowhere}, "at DATABASE_URL"},
	} {
		_, err := run(t, tc.env, "migrate")
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Fatalf("migrate against a PostgreSQL that does not answer: %v, want an error naming %q and no URL", err, tc.want)
		}
	}
}

// seed demo prints tokens a developer pastes into the web client and curl:
// a lifetime that is not positive must be refused, like token's, instead of
// printing tokens that are already expired (a negative --ttl) or that last
// some other lifetime than the one asked for (0).
func TestSeedDemoRefusesANonPositiveTTL(t *testing.T) {
	for _, ttl := range []string{"-1h", "0s"} {
		out, err := run(t, nil, "seed", "demo", "--ttl", ttl)
		if err == nil || !strings.Contains(err.Error(), "--ttl must be positive") {
			t.Errorf("seed demo --ttl %s: err %v, want a refusal naming --ttl", ttl, err)
		}
		if strings.Contains(out, "tokens") {
			t.Errorf("seed demo --ttl %s printed tokens: %s", ttl, out)
		}
	}
}

// "hanctl project create --id" with the id of a project that exists
// (pasted from the wrong place) is refused, exits non-zero and changes
// nothing: it used to rename the live project and rewrite the roles of
// the members it named (an admin became read), printing the id as if it
// had created it. --update makes the change on purpose.
func TestProjectCreateRefusesAnExistingID(t *testing.T) {
	if _, err := run(t, nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	admin := ids.New()
	out, err := run(t, nil, "project", "create", "--name", "billing", "--member", admin+":admin")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	state := func() (name, role string) {
		t.Helper()
		role, err := store.New(pool).ProjectRole(ctx, id, admin)
		if err == nil {
			err = pool.QueryRow(ctx, "SELECT name FROM projects WHERE id=$1", id).Scan(&name)
		}
		if err != nil {
			t.Fatal(err)
		}
		return name, role
	}

	out, err = run(t, nil, "project", "create", "--id", strings.ToUpper(id), "--name", "scratch", "--member", admin+":read")
	if err == nil || !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), "--update") {
		t.Fatalf("project create --id <existing>: %q %v, want a refusal that names --update", out, err)
	}
	if out != "" {
		t.Errorf("a refused create printed %q", out)
	}
	if name, role := state(); name != "billing" || role != store.RoleAdmin {
		t.Fatalf("after a refused create the project is named %q and its admin's role is %q", name, role)
	}

	if _, err := run(t, nil, "project", "create", "--name", "x", "--update"); err == nil || !strings.Contains(err.Error(), "--id") {
		t.Fatalf("--update without --id: %v", err)
	}
	out, err = run(t, nil, "project", "create", "--id", id, "--name", "scratch", "--member", admin+":read", "--update")
	if err != nil || strings.TrimSpace(out) != id {
		t.Fatalf("project create --id <existing> --update: %q %v", out, err)
	}
	if name, role := state(); name != "scratch" || role != store.RoleRead {
		t.Fatalf("after --update the project is named %q and the member's role is %q", name, role)
	}
}
