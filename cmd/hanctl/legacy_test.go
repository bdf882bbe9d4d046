package main

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

// legacyImportEnv starts a private redis-server for an import test: its
// admin client, the environment hanctl runs with (HAN_ENV stage, the
// package's migrated database), and a writer of entries files.
func legacyImportEnv(t *testing.T) (rs *testenv.RedisServer, admin *redis.Client, envs map[string]string, write func(string) string) {
	t.Helper()
	if _, err := run(t, nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	admin = rs.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	envs = map[string]string{"REDIS_URL": rs.URL(0), "HAN_ENV": "stage"}
	write = func(body string) string {
		f := filepath.Join(t.TempDir(), "entries.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	return rs, admin, envs, write
}

// newProject creates a project in the package's database and returns its id.
func newProject(t *testing.T) string {
	t.Helper()
	out, err := run(t, nil, "project", "create", "--name", "legacy import")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// han:prj keys in the server's DB0: what an import wrote.
func projectKeys(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	keys, err := admin.Keys(context.Background(), "han:prj:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestProjectLegacyImport(t *testing.T) {
	rs, admin, envs, write := legacyImportEnv(t)
	ctx := context.Background()
	projectID := newProject(t)
	keys := project.NewKeys("stage", projectID)

	f := write(`[{"key":"a","type":"string","value":"1"},{"key":"b/ü","type":"json","value":"{\"x\":[1]}"}]`)
	out, err := run(t, envs, "project", "legacy-import", "--project", projectID, "--file", f)
	if err != nil || !strings.Contains(out, "imported 2 legacy entries into han:prj:{stage:"+projectID+"}:cache") {
		t.Fatalf("import: %q %v", out, err)
	}
	got := admin.HGetAll(ctx, keys.CacheContainer()).Val()
	if len(got) != 2 || got["a"] != `{"type":"string","value":"1"}` || got["b/ü"] != `{"type":"json","value":"{\"x\":[1]}"}` {
		t.Fatalf("container: %v", got)
	}
	if ttl := admin.PTTL(ctx, keys.CacheContainer()).Val(); ttl != -1 {
		t.Fatalf("legacy container must have no TTL by default, got %v", ttl)
	}

	// --container-ttl gives the container a physical TTL.
	other := newProject(t)
	if _, err := run(t, envs, "project", "legacy-import", "--project", other, "--file", f, "--container-ttl", "1h"); err != nil {
		t.Fatal(err)
	}
	if ttl := admin.PTTL(ctx, project.NewKeys("stage", other).CacheContainer()).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("container TTL %v", ttl)
	}

	// Refusals write nothing.
	bad := newProject(t)
	for name, c := range map[string]struct {
		env  map[string]string
		body string
		args []string
	}{
		"control character": {envs, `[{"key":"a\u0001","type":"string","value":"1"}]`, nil},
		"key too long":      {envs, `[{"key":"` + strings.Repeat("k", 257) + `","type":"string","value":"1"}]`, nil},
		"bad type":          {envs, `[{"key":"a","type":"int","value":"1"}]`, nil},
		"bad json value":    {envs, `[{"key":"a","type":"json","value":"{"}]`, nil},
		"duplicate key":     {envs, `[{"key":"a","type":"string","value":"1"},{"key":"a","type":"string","value":"2"}]`, nil},
		"not an array":      {envs, `{"key":"a","type":"string","value":"1"}`, nil},
		"lone surrogate":    {envs, `[{"key":"\ud800","type":"string","value":"1"}]`, nil},
		"no REDIS_URL":      {map[string]string{"HAN_ENV": "stage"}, `[{"key":"a","type":"string","value":"1"}]`, nil},
		"bad HAN_ENV":       {map[string]string{"REDIS_URL": rs.URL(0), "HAN_ENV": "a:b"}, `[{"key":"a","type":"string","value":"1"}]`, nil},
	} {
		args := append([]string{"project", "legacy-import", "--project", bad, "--file", write(c.body)}, c.args...)
		if _, err := run(t, c.env, args...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// HAN_ENV is a name of letters, digits, '.', '_' and '-', as the
	// gateway reads it: "stage\r" (an env file with CRLF line ends) would
	// write keys the gateway of HAN_ENV=stage never reads.
	for _, v := range []string{"stage\r", "stage\u00a0"} {
		_, err := run(t, map[string]string{"REDIS_URL": rs.URL(0), "HAN_ENV": v}, "project", "legacy-import", "--project", bad, "--file", f)
		if err == nil || !strings.Contains(err.Error(), "HAN_ENV") {
			t.Errorf("HAN_ENV=%q: %v", v, err)
		}
	}
	if _, err := run(t, envs, "project", "legacy-import", "--project", "nope", "--file", f); err == nil {
		t.Error("a non-UUID project was accepted")
	}
	if n := admin.Exists(ctx, project.NewKeys("stage", bad).CacheContainer()).Val(); n != 0 {
		t.Fatal("a refused import wrote the container")
	}
	// A key that already exists as a normal entry cannot be legacy data.
	if err := admin.HSet(ctx, keys.CacheEntry("c"), "v", "x").Err(); err != nil {
		t.Fatal(err)
	}
	admin.Expire(ctx, keys.CacheEntry("c"), time.Minute)
	if _, err := run(t, envs, "project", "legacy-import", "--project", projectID, "--file", write(`[{"key":"c","type":"string","value":"1"}]`)); err == nil {
		t.Fatal("imported over a normal entry")
	}
}

// An entry bigger than any project's cache quota is refused before anything
// is written, one at the largest quota is imported, and a large import
// reaches Redis as several HSET commands (one command of a whole file
// would hold Redis for as long as it takes to run it).
func TestProjectLegacyImportSizes(t *testing.T) {
	_, admin, envs, write := legacyImportEnv(t)
	ctx := context.Background()
	over := newProject(t)
	big := strings.Repeat("v", project.CacheQuotaMaxBytes)
	if _, err := run(t, envs, "project", "legacy-import", "--project", over, "--file",
		write(`[{"key":"a","type":"string","value":"1"},{"key":"k","type":"string","value":"`+big+`"}]`)); err == nil ||
		!strings.Contains(err.Error(), "entry 1") {
		t.Fatalf("an entry over the largest quota: %v", err)
	}
	if n := admin.Exists(ctx, project.NewKeys("stage", over).CacheContainer()).Val(); n != 0 {
		t.Fatal("a refused import wrote the container")
	}

	fits := newProject(t)
	var b strings.Builder
	b.WriteString(`[{"key":"k","type":"string","value":"` + big[1:] + `"}`)
	for i := range 200 {
		b.WriteString(`,{"key":"e` + strconv.Itoa(i) + `","type":"json","value":"[` + strconv.Itoa(i) + `]"}`)
	}
	b.WriteString("]")
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, envs, "project", "legacy-import", "--project", fits, "--file", write(b.String())); err != nil {
		t.Fatalf("an entry at the largest quota: %v", err)
	}
	keys := project.NewKeys("stage", fits)
	if n := admin.HLen(ctx, keys.CacheContainer()).Val(); n != 201 {
		t.Fatalf("container holds %d fields, want 201", n)
	}
	if v := admin.HGet(ctx, keys.CacheContainer(), "e199").Val(); v != `{"type":"json","value":"[199]"}` {
		t.Fatalf("e199 = %q", v)
	}
	if n := len(admin.HGet(ctx, keys.CacheContainer(), "k").Val()); n < project.CacheQuotaMaxBytes {
		t.Fatalf("the large entry holds %d bytes", n)
	}
	stats := admin.Info(ctx, "commandstats").Val()
	m := regexp.MustCompile(`cmdstat_hset:calls=(\d+)`).FindStringSubmatch(stats)
	if m == nil {
		t.Fatalf("no HSET in commandstats: %s", stats)
	}
	if calls, _ := strconv.Atoi(m[1]); calls < 4 {
		t.Fatalf("201 entries and 16 MiB went in %d HSET commands, want the large entry alone and 64 fields at most per command", calls)
	}
}

// Member names are read as written: a file's "KEY", "Type" or "VALUE" is
// not its "key", "type" or "value" (the decoder matched them regardless of
// case and took the last of the two, which the checks had let through as
// distinct members).
func TestLegacyFileMembersAreReadAsWritten(t *testing.T) {
	entries, err := parseLegacyFile([]byte(`[{"key":"a","type":"string","value":"x","KEY":"b","Type":"json","VALUE":"1"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Key != "a" || entries[0].Type != "string" || entries[0].Value != "x" {
		t.Fatalf("imported %+v, want key a, type string, value x", entries)
	}
	if _, err := parseLegacyFile([]byte(`[{"KEY":"b","TYPE":"json","VALUE":"1"}]`)); err == nil {
		t.Fatal("an entry with no member named key, type or value was accepted")
	}
}

// A project id PostgreSQL does not know is refused before anything is
// written: the gateway answers for a project only after finding its row,
// so keys written under a mistyped id would belong to nobody. The refusal
// names the cause, never PostgreSQL's own error text, and so does every
// refusal for want of a database to check against.
func TestLegacyImportRefusesAProjectPostgreSQLDoesNotKnow(t *testing.T) {
	_, admin, envs, write := legacyImportEnv(t)
	f := write(`[{"key":"a","type":"string","value":"1"}]`)
	unknown := ids.New()
	_, err := run(t, envs, "project", "legacy-import", "--project", unknown, "--file", f)
	if err == nil || !strings.Contains(err.Error(), "project "+unknown+" does not exist") ||
		!strings.Contains(err.Error(), "hanctl project create") {
		t.Fatalf("an unknown project: %v", err)
	}
	if keys := projectKeys(t, admin); len(keys) != 0 {
		t.Fatalf("a refused import wrote %v", keys)
	}

	// A database the migrations never ran on has no projects table.
	bare, drop, err := testenv.CreateDatabase(context.Background(), env.DirectURL, "hanctl_legacy_bare")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	for name, c := range map[string]struct {
		db   map[string]string
		want string
	}{
		"no DATABASE_URL":     {map[string]string{"DATABASE_URL": ""}, "DATABASE_URL"},
		"unreachable":         {map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}, "cannot reach PostgreSQL"},
		"database unmigrated": {map[string]string{"DATABASE_URL": bare}, "hanctl migrate"},
	} {
		vars := map[string]string{}
		for k, v := range envs {
			vars[k] = v
		}
		for k, v := range c.db {
			vars[k] = v
		}
		_, err := run(t, vars, "project", "legacy-import", "--project", unknown, "--file", f)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "relation") ||
			strings.Contains(err.Error(), "SQLSTATE") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if keys := projectKeys(t, admin); len(keys) != 0 {
		t.Fatalf("a refused import wrote %v", keys)
	}
}

// Without HAN_ENV the import is refused, naming the variable: the keys
// carry the environment name the gateway runs with, and a default could be
// one no gateway reads.
func TestLegacyImportRefusesAnUnsetHANENV(t *testing.T) {
	_, admin, envs, write := legacyImportEnv(t)
	projectID := newProject(t)
	_, err := run(t, map[string]string{"REDIS_URL": envs["REDIS_URL"]}, "project", "legacy-import",
		"--project", projectID, "--file", write(`[{"key":"a","type":"string","value":"1"}]`))
	if err == nil || !strings.Contains(err.Error(), "HAN_ENV") {
		t.Fatalf("no HAN_ENV: %v", err)
	}
	if keys := projectKeys(t, admin); len(keys) != 0 {
		t.Fatalf("a refused import wrote %v", keys)
	}
}

// legacyMiBEntries is a file of n entries k0..k<n-1> of a MiB each; entry
// marked (if any) is made of legacyHoldMarker, which no other byte of the
// import carries.
func legacyMiBEntries(n, marked int) string {
	var b strings.Builder
	b.WriteString("[")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		val := strings.Repeat("v", 1<<20)
		if i == marked {
			val = strings.Repeat(legacyHoldMarker, (1<<20)/len(legacyHoldMarker))
		}
		b.WriteString(`{"key":"k` + strconv.Itoa(i) + `","type":"string","value":"` + val + `"}`)
	}
	b.WriteString("]")
	return b.String()
}

const legacyHoldMarker = "HOLD"

// redisVia returns a proxy to rs and the REDIS_URL of DB0 through it.
func redisVia(t *testing.T, rs *testenv.RedisServer) (*faultproxy.Proxy, string) {
	t.Helper()
	p, err := faultproxy.Start(rs.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, strings.Replace(rs.URL(0), rs.Addr(), p.Addr(), 1)
}

// A big file over a slow link (a VPN, a tunnel, another region) is
// imported whole. It used to go to Redis as one pipeline under the
// gateway's per-request budget (1 s): any file that took longer to cross
// the link failed as "redis unavailable", after part of it was written.
// 10 MiB here, at about 3 MiB/s.
func TestLegacyImportOverASlowLink(t *testing.T) {
	rs, admin, envs, write := legacyImportEnv(t)
	ctx := context.Background()
	id := newProject(t)
	f := write(legacyMiBEntries(10, -1))
	p, url := redisVia(t, rs)
	p.SetLatency(10 * time.Millisecond) // each read of at most 32 KiB waits 10 ms
	envs["REDIS_URL"] = url
	out, err := run(t, envs, "project", "legacy-import", "--project", id, "--file", f)
	container := project.NewKeys("stage", id).CacheContainer()
	if err != nil {
		t.Fatalf("a 10 MiB import over a slow link: %v (output %q); the container holds %d of the 10 entries",
			err, out, admin.HLen(ctx, container).Val())
	}
	if n := admin.HLen(ctx, container).Val(); n != 10 || !strings.Contains(out, "imported 10 legacy entries") {
		t.Fatalf("container holds %d entries, output %q", n, out)
	}
	if v := admin.HGet(ctx, container, "k9").Val(); len(v) < 1<<20 {
		t.Fatalf("k9 holds %d bytes", len(v))
	}
}

// An import Redis stops answering half-way ends at --timeout, reported as
// a timeout of the step that did not finish with how many entries were
// written (not as "redis unavailable"); running the same import again
// finishes it, and running it once more changes nothing.
func TestLegacyImportTimeoutThenReRun(t *testing.T) {
	rs, admin, envs, write := legacyImportEnv(t)
	ctx := context.Background()
	id := newProject(t)
	f := write(legacyMiBEntries(4, 2))
	p, url := redisVia(t, rs)
	held, _ := p.HoldRequest([]byte(legacyHoldMarker)) // entry 2's write never reaches Redis
	stalled := maps.Clone(envs)
	stalled["REDIS_URL"] = url
	r := runBounded(t, 30*time.Second, stalled, "project", "legacy-import", "--project", id, "--file", f, "--timeout", "3s")
	if r.hung || r.err == nil {
		t.Fatalf("an import whose Redis stopped answering: hung=%v err=%v out=%q", r.hung, r.err, r.out)
	}
	select {
	case <-held:
	default:
		t.Fatalf("the import failed before it sent entry 2: %v", r.err)
	}
	msg := r.err.Error()
	if !strings.HasPrefix(msg, "write entries: timed out") || !strings.Contains(msg, "--timeout 3s") ||
		!strings.Contains(msg, "2 of the 4 entries were written") || strings.Contains(msg, "unavailable") {
		t.Fatalf("import cut off by --timeout: %q, want the step named as timed out after --timeout 3s, with 2 of the 4 entries written", msg)
	}
	container := project.NewKeys("stage", id).CacheContainer()
	if n := admin.HLen(ctx, container).Val(); n != 2 {
		t.Fatalf("after the timed-out import the container holds %d entries, want the 2 written", n)
	}
	for range 2 {
		if out, err := run(t, envs, "project", "legacy-import", "--project", id, "--file", f); err != nil {
			t.Fatalf("the same import again: %v %q", err, out)
		}
		got := admin.HGetAll(ctx, container).Val()
		if len(got) != 4 || !strings.Contains(got["k2"], legacyHoldMarker) || !strings.Contains(got["k3"], `"value":"vvv`) {
			t.Fatalf("after the re-run the container holds %d entries", len(got))
		}
	}
}
