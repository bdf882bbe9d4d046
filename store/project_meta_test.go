package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// recordedMirror stands for the Redis mirror: it keeps the last values
// written to it.
type recordedMirror struct {
	mu     sync.Mutex
	m      project.Mirror
	writes int
}

func (r *recordedMirror) write(m project.Mirror) {
	r.mu.Lock()
	r.m, r.writes = m, r.writes+1
	r.mu.Unlock()
}

func (r *recordedMirror) get() (project.Mirror, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m, r.writes
}

// projectRow is the mirrored part of the project's row in PostgreSQL.
func projectRow(t *testing.T, st *store.Store, id string) project.Mirror {
	t.Helper()
	info, err := st.ProjectAccess(context.Background(), id, ids.New())
	if err != nil {
		t.Fatal(err)
	}
	return info.Mirror()
}

// A settings change whose COMMIT reached PostgreSQL and committed, but whose
// answer was lost, leaves the mirror with the committed values: the change
// fails (its outcome unknown to the caller), and the mirror is rewritten
// from PostgreSQL's row instead of being put back to the values from before
// the change, which PostgreSQL no longer holds.
func TestAnUnansweredSettingsCommitLeavesTheMirrorAsPostgreSQLHoldsIt(t *testing.T) {
	ctx := context.Background()
	// BEGIN and the UPDATE must be answered, and the COMMIT sent, within
	// the budget: a generous one, which the COMMIT then waits out.
	s, setUp, p := storeThroughProxy(t, answeredBudget)
	id := ids.New()
	if err := setUp.CreateProject(ctx, id, "p", nil); err != nil {
		t.Fatal(err)
	}
	var rec recordedMirror
	quota := int64(4096)
	calls := 0
	var committed <-chan struct{}
	_, err := s.UpdateProjectSettings(ctx, id, store.ProjectSettings{CacheQuotaBytes: &quota}, func(ctx context.Context, m project.Mirror) error {
		calls++
		rec.write(m)
		if calls == 1 {
			// The COMMIT that follows runs; its answer is lost, however
			// long it takes to be sent. The repair's new connection
			// gets its answers.
			committed = p.MuteRepliesAfter([]byte("commit"))
		}
		return nil
	})
	select {
	case <-committed:
	default:
		t.Fatalf("no COMMIT reached PostgreSQL: %v", err)
	}
	if err == nil || errors.Is(err, store.ErrDatabaseBusy) {
		t.Fatalf("a change whose COMMIT got no answer: %v, want an unavailable database", err)
	}
	if errors.Is(err, store.ErrMirrorRestore) {
		t.Fatalf("the mirror was not repaired: %v", err)
	}
	row := projectRow(t, s, id)
	if row.CacheQuotaBytes != quota {
		t.Fatalf("PostgreSQL holds quota %d: the COMMIT did not go through, the test proves nothing", row.CacheQuotaBytes)
	}
	if got, writes := rec.get(); got != row || writes != 2 {
		t.Fatalf("mirror %+v after %d writes, PostgreSQL holds %+v", got, writes, row)
	}
}

// A mirror write that got no answer may have written Redis; the change does
// not commit, and the mirror is rewritten from PostgreSQL's row (the values
// from before the change). A write Redis refused wrote nothing and is left
// alone.
func TestAMirrorWriteWithoutAnAnswerIsRewrittenFromPostgreSQL(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t)
	id := ids.New()
	if err := st.CreateProject(ctx, id, "p", nil); err != nil {
		t.Fatal(err)
	}
	before := projectRow(t, st, id)
	for _, tc := range []struct {
		failure error
		repair  bool
	}{
		{fmt.Errorf("store: redis error: %w", rds.ErrRedisUnavailable), true},
		{context.Canceled, true},
		{rds.ErrRedisOOM, false},
		{project.ErrDataStateInvalid, false},
	} {
		var rec recordedMirror
		paused := true
		_, err := st.UpdateProjectSettings(ctx, id, store.ProjectSettings{DeliveryPaused: &paused}, func(ctx context.Context, m project.Mirror) error {
			_, writes := rec.get()
			if writes == 0 {
				if tc.repair {
					rec.write(m) // written, but the answer is lost
				}
				return tc.failure
			}
			rec.write(m)
			return nil
		})
		if !errors.Is(err, tc.failure) || errors.Is(err, store.ErrMirrorRestore) {
			t.Fatalf("%v: the change's error %v", tc.failure, err)
		}
		if row := projectRow(t, st, id); row != before {
			t.Fatalf("%v: PostgreSQL changed: %+v, was %+v", tc.failure, row, before)
		}
		got, writes := rec.get()
		switch {
		case tc.repair && (got != before || writes != 2):
			t.Fatalf("%v: mirror %+v after %d writes, PostgreSQL holds %+v", tc.failure, got, writes, before)
		case !tc.repair && writes != 0:
			t.Fatalf("%v: a refused write was followed by %d more", tc.failure, writes)
		}
	}
}
