package store_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A connect storm's presence transitions: 600 concurrent DialogIDsForUser
// reads (users with no, one and many dialogs, limits that cut the list, an
// id that is not a UUID) each get exactly the dialogs a query of their own
// would return, newest first as the dialog listing orders them, and share
// far fewer queries than reads.
func TestDialogIDsForUserBatchesConcurrentReadsExactly(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	users := make([]string, 30)
	for i := range users {
		users[i] = ids.New()
		if err := st.EnsureUser(ctx, users[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Dialog k: creator users[k%10] with users[10+k%5]; users 20..29 have none.
	for k := range 25 {
		if _, err := st.CreateDialog(ctx, ids.New(), users[k%10], "", []string{users[10+k%5]}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(user string, limit int) []string {
		rows, err := pool.Query(ctx, `SELECT dialog_id::text FROM dialog_members WHERE user_id = $1
			ORDER BY dialog_created_at DESC, dialog_id DESC LIMIT $2`, user, limit)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		return out
	}
	before := st.UserDialogsStats()
	const n = 600
	got := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			user, limit := users[i%len(users)], 1000
			if i%7 == 0 {
				limit = 2
			}
			if i%97 == 3 {
				user = "not-a-uuid"
			}
			got[i], errs[i] = st.DialogIDsForUser(ctx, user, limit)
		})
	}
	wg.Wait()
	many := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("read %d: %v", i, errs[i])
		}
		user, limit := users[i%len(users)], 1000
		if i%7 == 0 {
			limit = 2
		}
		exp := []string(nil)
		if i%97 != 3 {
			exp = want(user, limit)
		}
		if !slices.Equal(got[i], exp) {
			t.Fatalf("read %d (user %d, limit %d) = %v, want %v", i, i%len(users), limit, got[i], exp)
		}
		if len(exp) > 2 {
			many++
		}
	}
	if many == 0 {
		t.Fatal("test data: no user with more than two dialogs")
	}
	st2 := st.UserDialogsStats()
	reads, queries := st2.Checks-before.Checks, st2.Queries-before.Queries
	if reads != n || queries == 0 || queries > n/4 {
		t.Fatalf("%d reads took %d queries, want far fewer queries than reads", reads, queries)
	}
}

// A presence transition of a user in more dialogs than it is published to
// goes to the user's most recent dialogs, the ones at the top of the
// dialog listing, not the oldest: for a user in 3,000 dialogs the read
// returns the 1,000 newest, newest first (ties on the creation time by id),
// and the statement reads them from dialog_members_listing_idx, 1,000
// memberships and no more, without scanning the table, beside another
// user's read in the same batch.
func TestDialogIDsForUserReadsTheNewestDialogs(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	const n, limit = 3000, 1000
	u, other, newest := userInManyDialogs(t, pool, n, 3)
	want := newest[:limit]
	got, err := st.DialogIDsForUser(ctx, u, limit)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("read %d dialogs, not the user's %d newest, newest first", len(got), limit)
	}

	plan := listingPlan(t, pool, store.UserDialogsSQL, []string{u, other}, []int32{limit, limit})
	var nodes []planNode
	var walk func(planNode)
	walk = func(p planNode) {
		nodes = append(nodes, p)
		for _, c := range p.Plans {
			walk(c)
		}
	}
	walk(plan)
	t.Logf("plan: %v", nodes)
	fromIndex := false
	for _, p := range nodes {
		if p.Relation == "dialog_members" && p.Index != "dialog_members_listing_idx" {
			t.Errorf("memberships read by %v, not in listing order from dialog_members_listing_idx", p)
		}
		if p.Index == "dialog_members_listing_idx" {
			fromIndex = true
		}
		// 1,003 memberships, the loops' average rounded.
		if p.read() > limit+3+2 {
			t.Errorf("%v reads more memberships than the two users' reads return", p)
		}
	}
	if !fromIndex {
		t.Errorf("the memberships do not come from dialog_members_listing_idx: %v", nodes)
	}
}
