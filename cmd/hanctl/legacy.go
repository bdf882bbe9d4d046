package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/config"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// cmdLegacyImport writes cache entries in the legacy v1 format (fields of
// the project's cache container HASH han:prj:{<env>:<project>}:cache, value
// {"type","value"}, no per-field expiry) so that the legacy behaviour of the
// project Redis API can be exercised and pre-upgrade data restored. The file
// is a JSON array of {"key","type":"json"|"string","value"}. It needs
// REDIS_URL, HAN_ENV (no default: the keys must carry the environment name
// the gateway runs with) and DATABASE_URL (or HAN_DATABASE_DIRECT_URL), where
// the project must exist: the gateway serves a project's keys only once it
// has found the project's row, so keys under an id PostgreSQL does not know
// would belong to nobody. Every refusal comes before anything is written.
// The whole command has --timeout (as the PostgreSQL commands do), and
// Redis has its own client (legacyImportRedis) sized for bulk writes.
func cmdLegacyImport(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("project legacy-import", flag.ContinueOnError)
	projectID := fs.String("project", "", "project id (UUID)")
	file := fs.String("file", "", "JSON array of {key, type, value}")
	ttl := fs.Duration("container-ttl", 0, "give the container a physical TTL (default: none, as legacy data had)")
	timeout := fs.Duration("timeout", defaultDBTimeout,
		"give up when the import has not finished within this time (PostgreSQL or Redis stalled, a slow link); the step is named")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	id, ok := ids.Canonical(*projectID)
	if !ok {
		return errors.New("--project must be a UUID")
	}
	if *file == "" {
		return errors.New("--file is required")
	}
	if *ttl < 0 {
		return errors.New("--container-ttl must not be negative")
	}
	env := getenv("HAN_ENV")
	if env == "" {
		return errors.New("HAN_ENV is required: set it to the gateway's HAN_ENV (dev when the gateway has none), the environment name its project keys carry")
	}
	if !config.IsName(env) {
		return errors.New("HAN_ENV: must be a name of letters, digits, '.', '_' and '-' only")
	}
	if getenv("REDIS_URL") == "" {
		return errors.New("REDIS_URL is required")
	}
	if getenv("DATABASE_URL") == "" && getenv("HAN_DATABASE_DIRECT_URL") == "" {
		return errors.New("DATABASE_URL (or HAN_DATABASE_DIRECT_URL) is required: the project must exist in PostgreSQL")
	}
	b, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("read --file: %w", err)
	}
	entries, err := parseLegacyFile(b)
	if err != nil {
		return err
	}
	db, err := startDBCommand(ctx, *timeout, getenv)
	if err != nil {
		return err
	}
	defer db.close()
	if err := checkProjectExists(db, id); err != nil {
		return err
	}
	rdb, err := openRedis("REDIS_URL", getenv, legacyImportRedis)
	if err != nil {
		return err
	}
	defer rdb.Close()
	keys := project.NewKeys(env, id)
	if err := project.ImportLegacyCache(db.ctx, rdb, keys, entries, *ttl); err != nil {
		return legacyImportError(db, len(entries), err)
	}
	fmt.Fprintf(out, "imported %d legacy entries into %s\n", len(entries), keys.CacheContainer())
	return nil
}

// legacyRedisTimeout bounds each round trip of an import to Redis: a
// pipeline of at most about 1 MiB (or one larger entry, up to 16 MiB) must
// reach Redis, and its answer come back, within it. The gateway's request
// budget (HAN_REDIS_TIMEOUT, 1 s) would fail any file that takes longer than
// that to cross the link.
const legacyRedisTimeout = time.Minute

// legacyImportRedis is the import's Redis client: one connection at a time,
// legacyRedisTimeout per round trip (--timeout bounds the whole), and no
// retry: a pipeline cut off may have been applied in part, and the
// operator, told so, runs the import again.
var legacyImportRedis = rds.RedisConfig{PoolSize: 1, MinIdleConns: 1, DialTimeout: 10 * time.Second,
	ReadTimeout: legacyRedisTimeout, WriteTimeout: legacyRedisTimeout, PoolTimeout: legacyRedisTimeout, MaxRetries: -1}

// legacyImportError says which step of the import failed and how: a
// timeout as a timeout (--timeout, or a round trip over
// legacyRedisTimeout), and how many entries were written before it. Redis's
// own text never appears (project.LegacyImportError holds its class only).
func legacyImportError(db *dbCommand, total int, err error) error {
	var ie *project.LegacyImportError
	if !errors.As(err, &ie) {
		return fmt.Errorf("import: %w", err)
	}
	var msg string
	switch {
	case errors.Is(context.Cause(db.ctx), errDBTimeout) || (ie.TimedOut && deadlinePassed(db.ctx)):
		msg = fmt.Sprintf("%s: timed out: not done within --timeout %s (Redis stalled, or a slow link: a larger --timeout gives a big file more time)",
			ie.Step, db.timeout)
	case db.ctx.Err() != nil:
		msg = ie.Step + ": interrupted"
	case ie.TimedOut:
		msg = fmt.Sprintf("%s: timed out: Redis did not answer one round trip (at most about 1 MiB of entries) within %s (Redis stalled, or a link too slow)",
			ie.Step, legacyRedisTimeout)
	default:
		msg = fmt.Sprintf("%s: %v", ie.Step, ie.Err)
	}
	if ie.Step == "check entries" {
		return fmt.Errorf("%s; nothing was written", msg)
	}
	return fmt.Errorf("%s; %d of the %d entries were written before it, and the last round trip may have written some more: "+
		"running the same import again writes them all (docs/project-redis-api.md, \"Legacy entries\")", msg, ie.Written, total)
}

// deadlinePassed reports whether ctx's deadline is past: a Redis round trip
// cut off by it fails as a network timeout, which may come a moment before
// the context itself reports its end.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// checkProjectExists refuses a project PostgreSQL has no row for. A
// failed query is named by its kind only (PostgreSQL's text may quote
// values); a stalled one ends at the command's --timeout.
func checkProjectExists(db *dbCommand, id string) error {
	exists, err := store.New(db.pool).ProjectExists(db.ctx, id)
	switch {
	case store.IsPGUndefinedTable(err):
		return errors.New("PostgreSQL has no projects table: run hanctl migrate against this database first")
	case err != nil:
		if err := db.check("check project", err); db.ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("cannot check that project %s exists in PostgreSQL (%s)", id, store.Kind(err))
	case !exists:
		return fmt.Errorf("project %s does not exist in PostgreSQL: check the id, or create it first with hanctl project create --id %s --name NAME", id, id)
	}
	return nil
}

// parseLegacyFile checks the file strictly and every entry by the rules
// the API applies to a PUT (key, type, JSON text for type json, and the
// entry's size against the largest quota: the API refuses a bigger one
// under every quota, and the cache reads were never meant to meet it).
func parseLegacyFile(b []byte) ([]project.LegacyEntry, error) {
	var raw []struct {
		Key   *string `json:"key"`
		Type  *string `json:"type"`
		Value *string `json:"value"`
	}
	if err := jsonx.Check(b); err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	if len(b) == 0 || b[firstNonSpace(b)] != '[' {
		return nil, errors.New("--file: want a JSON array of {key, type, value}")
	}
	// Member names as written: a case-insensitive match would take "KEY"
	// for "key", and of the two the check above let through, the last.
	if rest, err := json.Parse(b, &raw, json.DontMatchCaseInsensitiveStructFields); err != nil || len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("--file: want a JSON array of {key, type, value}")
	}
	if len(raw) == 0 {
		return nil, errors.New("--file: no entries")
	}
	out := make([]project.LegacyEntry, 0, len(raw))
	seen := map[string]bool{}
	for i, e := range raw {
		switch {
		case e.Key == nil || !project.ValidCacheKey(*e.Key):
			return nil, fmt.Errorf("entry %d: key must be 1..256 UTF-8 bytes without control characters", i)
		case seen[*e.Key]:
			return nil, fmt.Errorf("entry %d: duplicate key", i)
		case e.Type == nil || (*e.Type != "json" && *e.Type != "string"):
			return nil, fmt.Errorf("entry %d: type must be json or string", i)
		case e.Value == nil:
			return nil, fmt.Errorf("entry %d: value must be a string", i)
		case *e.Type == "json" && jsonx.Check([]byte(*e.Value)) != nil:
			return nil, fmt.Errorf("entry %d: value is not valid JSON text", i)
		case len(*e.Key)+len(*e.Value) > project.CacheQuotaMaxBytes:
			return nil, fmt.Errorf("entry %d: key and value take %d bytes, over the largest cache quota a project can have (%d)",
				i, len(*e.Key)+len(*e.Value), project.CacheQuotaMaxBytes)
		}
		seen[*e.Key] = true
		out = append(out, project.LegacyEntry{Key: *e.Key, Type: *e.Type, Value: *e.Value})
	}
	return out, nil
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return i
		}
	}
	return 0
}
