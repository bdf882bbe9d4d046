package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/han-app/gateway/store"
)

// schemaCheckWait bounds the start-up check of the schema.
const schemaCheckWait = 10 * time.Second

// checkSchema refuses to start the binary on a schema older than it needs:
// every migration built into it must be recorded in schema_migrations of
// the database it serves (DATABASE_URL), or the code that relies on them
// (a function a migration changed, a column it added) would fail at run
// time. Migrations recorded that the binary does not know are accepted: a
// newer binary applied them during a rolling deploy, and every migration is
// written so that the binary of the release before it still runs on the
// schema it leaves. One query, before anything else starts, so an instance
// refused never listens and /readyz never answers ready.
func (m *Main) checkSchema(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, schemaCheckWait)
	defer cancel()
	missing, err := store.MissingMigrations(cctx, m.pg)
	if err != nil {
		kind := store.Kind(err)
		m.Logger.Error("schema check: cannot read schema_migrations; refusing to start", slog.String("kind", kind))
		return fmt.Errorf("schema check: cannot read schema_migrations over DATABASE_URL (%s)", kind)
	}
	if len(missing) == 0 {
		return nil
	}
	how := "apply them with hanctl migrate (or start the gateway without -migrate=false), then start it again"
	if m.Migrate {
		// Applied a moment ago over HAN_DATABASE_DIRECT_URL, yet not
		// recorded where the requests go.
		how = "the migrations just ran over HAN_DATABASE_DIRECT_URL, which must name the database DATABASE_URL serves"
	}
	m.Logger.Error("database schema is older than this binary; refusing to start",
		slog.String("missing", strings.Join(missing, ",")), slog.String("fix", how))
	return fmt.Errorf("database schema lacks migrations %s: %s", strings.Join(missing, ", "), how)
}
