package store_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store"
)

// countedStore is a Store on a pool of its own whose statements are
// counted.
func countedStore(t testing.TB, maxConns int32) (*store.Store, *pgxpool.Pool, *pgCounter) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	counter := &pgCounter{}
	counter.count(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return store.New(pool), pool, counter
}

// newUsers records n users in one statement and returns their ids.
func newUsers(t testing.TB, pool *pgxpool.Pool, n int) []string {
	t.Helper()
	users := make([]string, n)
	for i := range users {
		users[i] = ids.New()
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO users(id) SELECT unnest($1::text[]::uuid[])`, users); err != nil {
		t.Fatal(err)
	}
	return users
}

func lastSeenOf(t *testing.T, pool *pgxpool.Pool, users []string) map[string]time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT id::text, last_seen_at FROM users WHERE id = ANY($1::text[]::uuid[]) AND last_seen_at IS NOT NULL`, users)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]time.Time{}
	for rows.Next() {
		var (
			id string
			at time.Time
		)
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		got[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// A storm of ended connections — a proxy restart closes every socket of an
// instance, a survivor's sweep turns a dead instance's users offline —
// records every user's own last-seen time in far fewer statements than
// records (each record was a statement and a commit of its own, and the
// storm held the whole pool while requests waited). A user recorded twice
// in the storm keeps the later time, an earlier record never moves a
// stored time back, and a record of an id that is no user, or is no UUID,
// fails nobody else's.
func TestLastSeenStormSharesStatements(t *testing.T) {
	s, pool, counter := countedStore(t, 20)
	ctx := context.Background()
	const n = 1000
	users := newUsers(t, pool, n)
	base := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	// users[0] was seen later than anything the storm records for them.
	later := base.Add(time.Hour)
	if err := s.TouchLastSeen(ctx, users[0], later); err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{users[0]: later}
	type rec struct {
		user string
		at   time.Time
	}
	var recs []rec
	for i, u := range users {
		at := base.Add(time.Duration(i) * time.Millisecond)
		recs = append(recs, rec{u, at})
		if i%10 == 1 { // a second, earlier record of the same user
			recs = append(recs, rec{u, at.Add(-time.Minute)})
		}
		if i > 0 {
			want[u] = at
		}
	}
	recs = append(recs, rec{ids.New(), base}, rec{"not-a-uuid", base}, rec{"", base})
	before, stats := counter.statements.Load(), s.LastSeenStats()
	var wg sync.WaitGroup
	errs := make(chan error, len(recs))
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.TouchLastSeen(ctx, r.user, r.at); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a record of the storm: %v", err)
	}
	statements := counter.statements.Load() - before
	if after := s.LastSeenStats(); after.Queries-stats.Queries != uint64(statements) || after.Checks-stats.Checks != uint64(len(recs)) {
		t.Fatalf("LastSeenStats: %d records in %d statements; made %d, statements sent %d",
			after.Checks-stats.Checks, after.Queries-stats.Queries, len(recs), statements)
	}
	if statements > int64(len(recs))/10 {
		t.Fatalf("%d records took %d statements, want at most %d", len(recs), statements, len(recs)/10)
	}
	got := lastSeenOf(t, pool, users)
	for _, u := range users {
		if !got[u].Equal(want[u]) {
			t.Fatalf("user %s: last seen %v, want %v", u, got[u], want[u])
		}
	}
	t.Logf("%d records in %d statements", len(recs), statements)
}

// BenchmarkTouchLastSeen records last-seen times from 64 concurrent callers
// per CPU (a storm of ended connections) into 4,096 users, as one UPDATE
// per record and through TouchLastSeen, whose concurrent records share a
// statement. Compare the two in the same run:
//
//	go test -run '^$' -bench TouchLastSeen -benchtime 20000x ./store/
func BenchmarkTouchLastSeen(b *testing.B) {
	s, pool, counter := countedStore(b, 20)
	ctx := context.Background()
	users := newUsers(b, pool, 4096)
	var pg loadtest.ProcCPU
	if pm := postmasterPID(b, pool); pm > 0 {
		if err := pg.Set("postgres=" + strconv.Itoa(pm) + "+"); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, touch func(u string, at time.Time) error) {
		b.SetParallelism(64)
		cpuBefore := pg.Sample()
		stmts := counter.statements.Load()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				if err := touch(users[i%len(users)], time.Now()); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(counter.statements.Load()-stmts)/float64(b.N), "statements/touch")
		if perOp := pg.Sample().PerOp(cpuBefore, int64(b.N)); perOp["postgres"] > 0 {
			b.ReportMetric(perOp["postgres"]*1000, "pg-cpu-µs/touch")
		}
	}
	b.Run("one_update_each", func(b *testing.B) {
		run(b, func(u string, at time.Time) error {
			_, err := pool.Exec(ctx, `UPDATE users SET last_seen_at = GREATEST(COALESCE(last_seen_at, $2), $2) WHERE id = $1`, u, at)
			return err
		})
	})
	b.Run("batched", func(b *testing.B) {
		run(b, func(u string, at time.Time) error { return s.TouchLastSeen(ctx, u, at) })
	})
}

// Two instances record last-seen times of the same users at once — one
// draining (TouchLastSeenMany), the other recording ended connections and
// offline transitions in batches — each in whatever order its users come:
// the rows are locked in one order everywhere, so no statement deadlocks
// (PostgreSQL would abort one with 40P01 and its users' times would be
// lost).
func TestLastSeenFromTwoInstancesNeverDeadlocks(t *testing.T) {
	a, pool, _ := countedStore(t, 10)
	b, _, _ := countedStore(t, 10)
	// The statements wait for each other's row locks, which on a loaded
	// machine can outlast the request budget (2 s): a statement cut short
	// by its budget is not what this test is about, a deadlock is.
	a.SetRequestTimeout(time.Minute)
	b.SetRequestTimeout(time.Minute)
	ctx := context.Background()
	users := newUsers(t, pool, 400)
	at := time.Now().Truncate(time.Microsecond)
	var wg sync.WaitGroup
	// Room for every statement's error: a sender never blocks.
	errs := make(chan error, 20*(2+100))
	for round := range 20 {
		perm := rand.Perm(len(users))
		order := make([]string, len(users))
		for i, k := range perm {
			order[i] = users[k]
		}
		wg.Add(3)
		go func() {
			defer wg.Done()
			errs <- a.TouchLastSeenMany(ctx, order, at.Add(time.Duration(round)*time.Millisecond))
		}()
		go func() {
			defer wg.Done()
			reversed := slices.Clone(order)
			slices.Reverse(reversed)
			errs <- b.TouchLastSeenMany(ctx, reversed, at.Add(time.Duration(round)*time.Millisecond))
		}()
		go func() {
			defer wg.Done()
			var inner sync.WaitGroup
			for _, u := range order[:100] {
				inner.Add(1)
				go func() {
					defer inner.Done()
					if err := b.TouchLastSeen(ctx, u, at.Add(time.Duration(round)*time.Millisecond)); err != nil {
						errs <- err
					}
				}()
			}
			inner.Wait()
		}()
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a last-seen statement failed: %v", err)
		}
	}
	latest := at.Add(19 * time.Millisecond)
	seen := lastSeenOf(t, pool, users)
	if len(seen) != len(users) {
		t.Fatalf("%d of %d users have a last-seen time", len(seen), len(users))
	}
	for u, got := range seen {
		if !got.Equal(latest) {
			t.Fatalf("user %s: last seen %v, want %v", u, got, latest)
		}
	}
}
