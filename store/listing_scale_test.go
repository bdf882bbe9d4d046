package store_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A dialog listing page reads the page, not the user's dialogs: for a user
// in 5,000 dialogs, every node of a page's plan reads a number of rows set
// by the page size (the page's memberships, their dialogs, each dialog's
// members and newest message), on the first page and after a cursor alike.
// Paging through them all lists every dialog once, newest first (ties on
// the creation time by id), and the cursor keeps its format, so a cursor
// the previous release handed out goes on where it stopped. The
// memberships are written as the previous release writes them, without
// their dialog's creation time.
func TestDialogListingPageReadsOnlyThePage(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	const n, limit = 5000, 50
	u, _, want := userInManyDialogs(t, pool, n, 0)

	checkPageReads(t, pool, listingPlan(t, pool, store.ListDialogsSQL(false), u, limit+1), limit+1, 2)
	var mid store.Dialog
	if err := pool.QueryRow(ctx, `SELECT created_at FROM dialogs WHERE id = $1`, want[n/2]).Scan(&mid.CreatedAt); err != nil {
		t.Fatal(err)
	}
	checkPageReads(t, pool, listingPlan(t, pool, store.ListDialogsSQL(true), u, limit+1, mid.CreatedAt, want[n/2]), limit+1, 2)

	var got []string
	cursor := ""
	for page := 0; ; page++ {
		items, next, err := st.ListDialogs(ctx, u, cursor, limit)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range items {
			got = append(got, d.ID)
		}
		if next == "" {
			break
		}
		last := items[len(items)-1]
		// The cursor's format: base64url of "<created_at in µs>:<id>".
		if old := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d:%s", last.CreatedAt.UnixMicro(), last.ID))); next != old {
			t.Fatalf("page %d: cursor %q, the previous release's for the same dialog is %q", page, next, old)
		}
		cursor = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paging listed %d dialogs, not the user's %d newest first once each", len(got), len(want))
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType      string     `json:"Node Type"`
	Relation      string     `json:"Relation Name"`
	Index         string     `json:"Index Name"`
	ActualRows    float64    `json:"Actual Rows"`
	ActualLoops   float64    `json:"Actual Loops"`
	RemovedFilter float64    `json:"Rows Removed by Filter"`
	RemovedRcheck float64    `json:"Rows Removed by Index Recheck"`
	RemovedJoin   float64    `json:"Rows Removed by Join Filter"`
	Plans         []planNode `json:"Plans"`
}

// read is the number of rows the node read: those it returned and those
// its filters dropped, over all its loops.
func (p planNode) read() float64 {
	return (p.ActualRows + p.RemovedFilter + p.RemovedRcheck + p.RemovedJoin) * p.ActualLoops
}

func (p planNode) String() string {
	return fmt.Sprintf("%s %s %s (read %.0f)", p.NodeType, p.Relation, p.Index, p.read())
}

// listingPlan runs the listing's statement under EXPLAIN (ANALYZE, FORMAT
// JSON) and returns its plan.
func listingPlan(t *testing.T, pool *pgxpool.Pool, q string, args ...any) planNode {
	t.Helper()
	var raw string
	if err := pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+q, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil || len(out) != 1 {
		t.Fatalf("plan %s: %v", raw, err)
	}
	return out[0].Plan
}

// checkPageReads fails unless the page's memberships come from the listing
// index, at most page of them, and no node reads more than page × perDialog
// rows (perDialog: the members of each listed dialog).
func checkPageReads(t *testing.T, pool *pgxpool.Pool, plan planNode, page, perDialog int) {
	t.Helper()
	var nodes []planNode
	var walk func(planNode)
	walk = func(p planNode) {
		nodes = append(nodes, p)
		for _, c := range p.Plans {
			walk(c)
		}
	}
	walk(plan)
	fromIndex := false
	for _, p := range nodes {
		if p.Index == "dialog_members_listing_idx" {
			fromIndex = true
			if p.read() > float64(page) {
				t.Errorf("the page of %d read %.0f memberships from the listing index", page, p.read())
			}
		}
		if p.read() > float64(page*perDialog) {
			t.Errorf("a page of %d: %v reads more rows than the page's dialogs hold", page, p)
		}
	}
	if !fromIndex {
		t.Errorf("the page's memberships do not come from dialog_members_listing_idx: %v", nodes)
	}
}

// userInManyDialogs writes a user u in n dialogs that u created, two a
// minute going back from now (ties on the creation time, broken by id;
// neither the ids nor the insert order give the newest), and another user
// in the oldest otherIn of them (all when otherIn is 0), with the
// memberships written as the release before the listing index writes
// them, without their dialog's creation time; then ANALYZE. newest is u's
// dialogs as the listing orders them, newest first (ties by id).
func userInManyDialogs(t *testing.T, pool *pgxpool.Pool, n, otherIn int) (u, other string, newest []string) {
	t.Helper()
	ctx := context.Background()
	u, other = ids.New(), ids.New()
	if otherIn == 0 {
		otherIn = n
	}
	for _, step := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO users(id) VALUES ($1), ($2)`, []any{u, other}},
		{`INSERT INTO dialogs(id, created_by, created_at) SELECT gen_random_uuid(), $1,
			date_trunc('minute', now()) - (g / 2) * interval '1 minute' FROM generate_series(1, $2::int) g`, []any{u, n}},
		{`INSERT INTO dialog_members(dialog_id, user_id) SELECT id, $1 FROM dialogs WHERE created_by = $1`, []any{u}},
		{`INSERT INTO dialog_members(dialog_id, user_id) SELECT id, $2 FROM dialogs WHERE created_by = $1
			ORDER BY created_at LIMIT $3`, []any{u, other, otherIn}},
		{`ANALYZE dialogs`, nil},
		{`ANALYZE dialog_members`, nil},
	} {
		if _, err := pool.Exec(ctx, step.q, step.args...); err != nil {
			t.Fatalf("%s: %v", step.q, err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id::text FROM dialogs WHERE created_by = $1 ORDER BY created_at DESC, id DESC`, u)
	if err == nil {
		newest, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(newest) != n {
		t.Fatalf("%d dialogs, %v", len(newest), err)
	}
	return u, other, newest
}
