package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// A reconnect storm's subscribes: 1,000 concurrent DialogLastSeq checks
// (members, non-members, dialogs that do not exist, ids that are not UUIDs)
// each get exactly the answer of a query of their own, and they share far
// fewer queries than checks.
func TestDialogLastSeqBatchesConcurrentChecksExactly(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	users := make([]string, 12)
	for i := range users {
		users[i] = ids.New()
		if err := st.EnsureUser(ctx, users[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Dialog k has the members users[k%12] and users[(k+1)%12] (plus the
	// creator's own membership) and last_seq 1000+k.
	dialogs := make([]string, 40)
	for k := range dialogs {
		d, err := st.CreateDialog(ctx, ids.New(), users[k%12], "", []string{users[(k+1)%12]})
		if err != nil {
			t.Fatal(err)
		}
		dialogs[k] = d.ID
		if _, err := pool.Exec(ctx, `UPDATE dialogs SET last_seq = $2 WHERE id = $1`, d.ID, 1000+k); err != nil {
			t.Fatal(err)
		}
	}
	type pair struct {
		dialog, user string
		seq          int64 // -1: not a member
	}
	const n = 1000
	pairs := make([]pair, n)
	members := 0
	for i := range pairs {
		k, u := i%len(dialogs), (i/len(dialogs))%len(users)
		p := pair{dialog: dialogs[k], user: users[u], seq: -1}
		if u == k%12 || u == (k+1)%12 {
			p.seq = int64(1000 + k)
			members++
		}
		switch i % 97 {
		case 5:
			p.dialog, p.seq = ids.New(), -1 // no such dialog
		case 6:
			p.dialog, p.seq = "not-a-uuid", -1
		case 7:
			p.user, p.seq = "x", -1
		}
		pairs[i] = p
	}
	if members < 100 || members > n-100 {
		t.Fatalf("test data: %d members of %d pairs, want a mix", members, n)
	}
	// The expectation holds against the tables themselves too.
	for _, p := range pairs[:80] {
		var seq int64 = -1
		if ids.Valid(p.dialog) && ids.Valid(p.user) {
			err := pool.QueryRow(ctx, `SELECT d.last_seq FROM dialogs d JOIN dialog_members m
				ON m.dialog_id = d.id AND m.user_id = $2 WHERE d.id = $1`, p.dialog, p.user).Scan(&seq)
			if err != nil {
				seq = -1
			}
		}
		if seq != p.seq {
			t.Fatalf("test data: pair %v has seq %d in the tables", p, seq)
		}
	}

	before := st.SubscribeCheckStats()
	start := make(chan struct{})
	errs := make([]error, n)
	got := make([]int64, n)
	var wg sync.WaitGroup
	for i := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = st.DialogLastSeq(ctx, pairs[i].dialog, pairs[i].user)
		}()
	}
	close(start)
	wg.Wait()
	for i, p := range pairs {
		switch {
		case p.seq < 0 && !errors.Is(errs[i], store.ErrDialogNotFound):
			t.Errorf("pair %d (non-member): got seq %d, err %v; want ErrDialogNotFound", i, got[i], errs[i])
		case p.seq >= 0 && (errs[i] != nil || got[i] != p.seq):
			t.Errorf("pair %d (member): got seq %d, err %v; want %d", i, got[i], errs[i], p.seq)
		}
	}
	after := st.SubscribeCheckStats()
	checks, queries := after.Checks-before.Checks, after.Queries-before.Queries
	if checks != n {
		t.Fatalf("%d checks counted, want %d", checks, n)
	}
	if queries == 0 || queries > n/10 {
		t.Fatalf("%d checks took %d queries, want at most %d", n, queries, n/10)
	}
	t.Logf("%d checks, %d queries", checks, queries)
}

// A lone check is answered at once by its own query, and a caller whose
// context has ended gets its context's error, not an answer.
func TestDialogLastSeqLoneAndCancelled(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), a, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	before := st.SubscribeCheckStats()
	if seq, err := st.DialogLastSeq(ctx, d.ID, a); err != nil || seq != 0 {
		t.Fatalf("member: seq %d, err %v; want 0, nil", seq, err)
	}
	if _, err := st.DialogLastSeq(ctx, d.ID, b); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("non-member: err %v, want ErrDialogNotFound", err)
	}
	if after := st.SubscribeCheckStats(); after.Queries-before.Queries != 2 {
		t.Fatalf("two lone checks took %d queries, want 2", after.Queries-before.Queries)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := st.DialogLastSeq(cctx, d.ID, a); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: err %v, want context.Canceled", err)
	}
}

// With a realtime linger, a check that finds its statement free waits for
// company: checks (and the presence transitions' dialog reads) that arrive
// within it share one query, each with its own answer.
func TestRealtimeLingerSharesOneQuery(t *testing.T) {
	st, _ := openStore(t)
	st.SetRealtimeLinger(300 * time.Millisecond)
	ctx := context.Background()
	users := []string{ids.New(), ids.New(), ids.New(), ids.New()}
	for _, u := range users {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), users[0], "", []string{users[1], users[2]})
	if err != nil {
		t.Fatal(err)
	}
	for _, check := range []struct {
		name  string
		stats func() store.SubscribeCheckStats
		call  func(i int) error
	}{
		{"subscribe checks", st.SubscribeCheckStats, func(i int) error {
			_, err := st.DialogLastSeq(ctx, d.ID, users[i])
			if i < 3 && err != nil || i == 3 && !errors.Is(err, store.ErrDialogNotFound) {
				return fmt.Errorf("check %d: %v", i, err)
			}
			return nil
		}},
		{"user dialogs", st.UserDialogsStats, func(i int) error {
			got, err := st.DialogIDsForUser(ctx, users[i], 10)
			if want := map[bool]int{true: 1, false: 0}[i < 3]; err != nil || len(got) != want {
				return fmt.Errorf("dialogs of user %d: %v %v", i, got, err)
			}
			return nil
		}},
	} {
		before := check.stats()
		start := time.Now()
		var wg sync.WaitGroup
		for i := range users {
			wg.Go(func() {
				if err := check.call(i); err != nil {
					t.Error(err)
				}
			})
			if i == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		wg.Wait()
		if waited := time.Since(start); waited < 300*time.Millisecond {
			t.Fatalf("%s: the first was answered after %v, before its linger ended", check.name, waited)
		}
		if q := check.stats().Queries - before.Queries; q != 1 {
			t.Fatalf("%s: four calls within the linger took %d queries, want one", check.name, q)
		}
	}
}

// A subscribe check queued behind a stalled query (a lock held by an ALTER,
// a VACUUM FULL, a stuck disk) returns at its own deadline with its
// context's error, without waiting for the query; the stalled check is
// answered once the stall ends.
func TestASubscribeCheckQueuedBehindAStalledQueryLeavesAtItsDeadline(t *testing.T) {
	st, _ := openStore(t)
	f := newSendFixture(t, st, 2)
	ctx := context.Background()
	lock := testenv.LockTable(t, env.DatabaseURL, "dialog_members", "ACCESS EXCLUSIVE")
	stalled := make(chan error, 1)
	go func() {
		_, err := st.DialogLastSeq(ctx, f.dialog, f.users[0])
		stalled <- err
	}()
	lock.WaitBlocked(1)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := st.DialogLastSeq(short, f.dialog, f.users[1])
	if took := time.Since(start); took > time.Second || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a check with a 200ms deadline behind a stalled query: %v after %v", err, took)
	}
	lock.Release()
	if err := <-stalled; err != nil {
		t.Fatalf("the stalled check once the stall ended: %v", err)
	}
	if seq, err := st.DialogLastSeq(ctx, f.dialog, f.users[1]); err != nil || seq != 0 {
		t.Fatalf("a check after the stall: seq %d, err %v", seq, err)
	}
}
