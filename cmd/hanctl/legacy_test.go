package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

func TestProjectLegacyImport(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	admin := rs.AdminClient(0)
	defer admin.Close()
	ctx := context.Background()
	envs := map[string]string{"REDIS_URL": rs.URL(0), "HAN_ENV": "stage"}
	write := func(body string) string {
		f := filepath.Join(t.TempDir(), "entries.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	projectID := ids.New()
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
	other := ids.New()
	if _, err := run(t, envs, "project", "legacy-import", "--project", other, "--file", f, "--container-ttl", "1h"); err != nil {
		t.Fatal(err)
	}
	if ttl := admin.PTTL(ctx, project.NewKeys("stage", other).CacheContainer()).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("container TTL %v", ttl)
	}

	// Refusals write nothing.
	bad := ids.New()
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
