package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

// Two instances with DATABASE_URL through PgBouncer in transaction pooling
// and HAN_DB_EXEC_MODE=exec, without HAN_DATABASE_DIRECT_URL: both start,
// the second one's start-up migration (run over DATABASE_URL) meeting no
// prepared statement the first one left on the server connection.
func TestSecondInstanceStartsBehindPgBouncerWithoutDirectURL(t *testing.T) {
	b := testenv.BouncerFor(t, env)
	ctx := context.Background()
	direct, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, "gw_bouncer_second_instance")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	vars := baseEnv()
	vars["DATABASE_URL"] = b.URL(direct, "")
	vars["HAN_DB_EXEC_MODE"] = "exec"
	for i := 1; i <= 2; i++ {
		m := NewMain()
		if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
			t.Fatal(err)
		}
		m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
		err := m.Run(ctx)
		t.Cleanup(func() { _ = m.Close() })
		if err != nil {
			t.Fatalf("instance #%d did not start: %v", i, err)
		}
	}
}
