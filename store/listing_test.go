package store_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// The listing carries each dialog's newest message (nil without one), from
// the same snapshot as its lastSeq, and reads it with one backward probe
// of the (dialog_id, seq) index per listed dialog: no scan or sort of a
// dialog's messages, however many it has.
func TestListDialogsReadsTheLastMessageByIndex(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	empty, err := st.CreateDialog(ctx, ids.New(), a, "empty", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := st.CreateDialog(ctx, ids.New(), a, "busy", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing here is kept
	// 50k messages in the busy dialog, written directly (this test is
	// about reading them).
	const n = 50000
	if _, err := tx.Exec(ctx, `INSERT INTO messages(id, dialog_id, seq, sender_id, body)
		SELECT gen_random_uuid(), $1, s, $2, 'm' || s FROM generate_series(1, $3::int) s`, busy.ID, b, n); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE dialogs SET last_seq = $2 WHERE id = $1`, busy.ID, n); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ANALYZE messages`); err != nil {
		t.Fatal(err)
	}
	plan := explain(t, tx, "(ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+store.ListDialogsSQL(false), a, 51)
	probe := regexp.MustCompile(`Index Scan Backward using messages_dialog_id_seq_key on messages .*\(actual rows=[01](\.\d+)? loops=2\)`)
	if !probe.MatchString(plan) || strings.Contains(plan, "Seq Scan on messages") || strings.Contains(plan, "Sort Key: messages") ||
		strings.Contains(plan, "Bitmap Heap Scan on messages") {
		t.Fatalf("the last message is not one index probe per dialog:\n%s", plan)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	items, next, err := st.ListDialogs(ctx, b, "", 50)
	if err != nil || next != "" || len(items) != 2 {
		t.Fatalf("listing: %d items, next %q, %v", len(items), next, err)
	}
	if items[0].ID != busy.ID || items[1].ID != empty.ID {
		t.Fatalf("not newest first: %s, %s", items[0].Title, items[1].Title)
	}
	if m := items[0].LastMessage; m == nil || m.Seq != n || m.Seq != items[0].LastSeq || m.Body != "m50000" || m.SenderID != b ||
		m.DialogID != busy.ID || m.Attachments != nil {
		t.Fatalf("busy dialog's last message: %+v", m)
	}
	if items[1].LastMessage != nil {
		t.Fatalf("a dialog without messages has a last message: %+v", items[1].LastMessage)
	}
	// Paging keeps it: the second page's dialog has none.
	page, next, err := st.ListDialogs(ctx, a, "", 1)
	if err != nil || len(page) != 1 || page[0].LastMessage == nil || next == "" {
		t.Fatalf("first page: %+v %q %v", page, next, err)
	}
	page, next, err = st.ListDialogs(ctx, a, next, 1)
	if err != nil || len(page) != 1 || page[0].ID != empty.ID || page[0].LastMessage != nil || next != "" {
		t.Fatalf("second page: %+v %q %v", page, next, err)
	}
}
