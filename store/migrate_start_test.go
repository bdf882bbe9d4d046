package store_test

import (
	"context"
	"testing"

	"github.com/han-app/gateway/store"
)

// Every instance migrates as it starts, and nearly every start finds each
// migration recorded already. That costs one statement and takes no
// migration lock: instances starting together do not take turns at the
// lock, once per migration, only to find nothing to do (on a loaded host
// those turns made a start last seconds).
func TestMigratingAMigratedDatabaseIsOneRead(t *testing.T) {
	_, pool, counter := countedStore(t, 1) // migrated
	before := counter.statements.Load()
	applied, err := store.Migrate(context.Background(), pool)
	if err != nil || len(applied) != 0 {
		t.Fatalf("applied %v: %v", applied, err)
	}
	if n := counter.statements.Load() - before; n != 1 {
		t.Fatalf("migrating a migrated database ran %d statements, want 1", n)
	}
}
