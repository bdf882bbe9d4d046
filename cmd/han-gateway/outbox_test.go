package main

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The service purges delivered outbox rows once their delivery is older
// than HAN_OUTBOX_RETENTION, keeps younger ones and undelivered ones, counts
// what it purged on /metrics, and stops the purge on Close (TestMain's
// goleak check fails the package if it kept running).
func TestServicePurgesDeliveredOutboxRows(t *testing.T) {
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	old, young, pending := ids.New(), ids.New(), ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, created_at, delivered_at) VALUES
		($1, 'han:rt:dialog:purge-test', '\x00', now() - interval '3 hours', now() - interval '2 hours'),
		($2, 'han:rt:dialog:purge-test', '\x00', now() - interval '3 hours', now() - interval '30 minutes'),
		($3, 'han:rt:dialog:purge-test', '\x00', now() - interval '3 hours', NULL)`, old, young, pending); err != nil {
		t.Fatal(err)
	}
	vars := baseEnv()
	vars["HAN_OUTBOX_RETENTION"] = "1h"
	m := start(t, vars)
	exists := func(id string) bool {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE event_id=$1)", id).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return !exists(old) }, "the delivered row past the retention was not purged")
	if !exists(young) || !exists(pending) {
		t.Fatalf("purged a row it must keep: delivered within the retention %v, undelivered %v", exists(young), exists(pending))
	}
	fams := scrape(t, m)
	if f := fams["han_outbox_purged_total"]; f == nil || f.GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Fatal("han_outbox_purged_total does not count the purge")
	}
	for _, name := range []string{"han_outbox_marks_total", "han_outbox_marks_dropped_total", "han_outbox_undelivered_past_retention"} {
		if fams[name] == nil {
			t.Errorf("%s is not exposed", name)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
