package store_test

import (
	"context"
	"sync"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// The reconnect storm after a restart: an instance that knows no user
// records 600 first sights at once (300 new ids, each twice, and 20 ids
// PostgreSQL already has). Every id is recorded exactly once, the
// concurrent records share far fewer statements than calls, an id that is
// not a UUID fails alone, and a canceled call records nothing.
func TestEnsureUserBatchesConcurrentFirstSights(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	fresh := make([]string, 300)
	for i := range fresh {
		fresh[i] = ids.New()
	}
	old := make([]string, 20)
	for i := range old {
		old[i] = ids.New()
		if _, err := pool.Exec(ctx, `INSERT INTO users(id) VALUES ($1)`, old[i]); err != nil {
			t.Fatal(err)
		}
	}
	before := st.EnsureUserStats()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 2*len(fresh)+len(old)+1)
	for i := range errs {
		wg.Go(func() {
			<-start
			switch {
			case i < 2*len(fresh):
				errs[i] = st.EnsureUser(ctx, fresh[i/2])
			case i < len(errs)-1:
				errs[i] = st.EnsureUser(ctx, old[i-2*len(fresh)])
			default:
				errs[i] = st.EnsureUser(ctx, "not-a-uuid")
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if (err != nil) != (i == len(errs)-1) {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	var n int
	all := append(append([]string(nil), fresh...), old...)
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM users WHERE id = ANY($1::text[]::uuid[])`, all).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(all) {
		t.Fatalf("%d of %d users recorded", n, len(all))
	}
	after := st.EnsureUserStats()
	calls, queries := after.Checks-before.Checks, after.Queries-before.Queries
	if calls < uint64(len(fresh)+len(old)) || queries*4 > calls {
		t.Fatalf("%d records took %d statements (want them shared, at most a quarter)", calls, queries)
	}
	// Known now: no further write.
	if err := st.EnsureUser(ctx, fresh[0]); err != nil || st.EnsureUserStats().Checks != after.Checks {
		t.Fatalf("a known user was written again: %v %+v", err, st.EnsureUserStats())
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	id := ids.New()
	if err := st.EnsureUser(canceled, id); err == nil {
		t.Fatal("a canceled record succeeded")
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM users WHERE id = $1`, id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a canceled record wrote %d rows (%v)", n, err)
	}
}
