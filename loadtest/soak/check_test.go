package soak_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/loadtest/soak"
	"github.com/han-app/gateway/store"
	prj "github.com/han-app/gateway/store/project"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Postgres: true, Redis: true}, &env)
}

// world is a dialog of two members with three messages sent the way the
// service sends them, and the records a soak's senders and clients would
// hold for them.
type world struct {
	pool    *pgxpool.Pool
	st      *store.Store
	checker *soak.Checker
	dialog  string
	members map[string][]string
	sends   []soak.SendRecord
	views   []soak.ClientView
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	r0, r1 := env.Redis.AdminClient(0), env.Redis.AdminClient(1)
	t.Cleanup(func() { r0.Close(); r1.Close() })
	w := &world{pool: pool, st: store.New(pool), checker: &soak.Checker{DB: pool, Redis0: r0, Redis1: r1, Env: "dev"}}
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := w.st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := w.st.CreateDialog(ctx, ids.New(), a, "soak", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	w.dialog = d.ID
	w.members = map[string][]string{d.ID: {a, b}}
	view := map[int64]string{}
	for range 3 {
		key := ids.New()
		m, _, _, err := w.st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: a, Body: soak.BodyPrefix + key})
		if err != nil {
			t.Fatal(err)
		}
		w.sends = append(w.sends, soak.SendRecord{Key: key, DialogID: d.ID, Confirmed: true, MessageID: m.ID, Seq: m.Seq})
		view[m.Seq] = m.ID
	}
	for _, u := range []string{a, b} {
		cp := map[int64]string{}
		for k, v := range view {
			cp[k] = v
		}
		w.views = append(w.views, soak.ClientView{UserID: u, Dialogs: map[string]map[int64]string{d.ID: cp}})
	}
	return w
}

func (w *world) check(t *testing.T) []soak.Violation {
	t.Helper()
	rows, vs, err := w.checker.Messages(context.Background(), []string{w.dialog}, w.sends)
	if err != nil {
		t.Fatal(err)
	}
	return append(vs, soak.CheckClients(rows, w.members, w.views)...)
}

func invariants(vs []soak.Violation) string {
	var names []string
	for _, v := range vs {
		names = append(names, v.Invariant)
	}
	return strings.Join(names, ",")
}

func TestCheckerPassesConsistentState(t *testing.T) {
	w := newWorld(t)
	if vs := w.check(t); len(vs) != 0 {
		t.Fatalf("violations on consistent state: %+v", vs)
	}
}

// A second row for an Idempotency-Key that got its 201, inserted behind
// the service's back (with the next seq, as a double-applied send would).
func TestCheckerCatchesDuplicateRow(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	s := w.sends[1]
	if _, err := w.pool.Exec(ctx, `WITH d AS (UPDATE dialogs SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq)
		INSERT INTO messages (id, dialog_id, seq, sender_id, body) SELECT $2, $1, d.last_seq, m.sender_id, m.body FROM d, messages m WHERE m.id = $3`,
		w.dialog, ids.New(), s.MessageID); err != nil {
		t.Fatal(err)
	}
	vs := w.check(t)
	if !strings.Contains(invariants(vs), soak.InvDuplicateRow) {
		t.Fatalf("duplicate row not reported; got %+v", vs)
	}
	// The clients never saw the extra row: the delivery check names it too.
	if !strings.Contains(invariants(vs), soak.InvNotDelivered) {
		t.Fatalf("undelivered extra row not reported; got %+v", vs)
	}
}

// A committed message deleted behind the service's back: its 201 has no
// row and its dialog's seqs have a gap.
func TestCheckerCatchesLostMessageAndSeqGap(t *testing.T) {
	w := newWorld(t)
	if _, err := w.pool.Exec(context.Background(), `DELETE FROM messages WHERE id = $1`, w.sends[1].MessageID); err != nil {
		t.Fatal(err)
	}
	got := invariants(w.check(t))
	for _, want := range []string{soak.InvLostMessage, soak.InvSeqGap, soak.InvPhantom} {
		if !strings.Contains(got, want) {
			t.Errorf("%s not reported; got %s", want, got)
		}
	}
}

// A member whose client missed a message (no reconciliation) is reported.
func TestCheckerCatchesUndeliveredMessage(t *testing.T) {
	w := newWorld(t)
	delete(w.views[1].Dialogs[w.dialog], w.sends[2].Seq)
	if got := invariants(w.check(t)); got != soak.InvNotDelivered {
		t.Fatalf("want only %s, got %q", soak.InvNotDelivered, got)
	}
}

// Budget counters: a negative one, and a drained project whose bytes did
// not go back to the dedupe floor.
func TestCheckerCatchesBudgetViolations(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	project := ids.New()
	w.checker.ProjectID = project
	k := prj.NewKeys("dev", project).Budget()
	rec := soak.DedupeRecordBytes(ids.New(), "p", ids.New())
	if err := w.checker.Redis0.HSet(ctx, k, "msg", 0, "rcpt", 0, "dd", rec).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.checker.Redis0.Del(context.Background(), k) })
	vs, budget, err := w.checker.Budgets(ctx)
	if err != nil || len(vs) != 0 {
		t.Fatalf("consistent budget: %v %+v", err, vs)
	}
	if vs := soak.BudgetFloor(budget, rec, rec); len(vs) != 0 {
		t.Fatalf("budget at its floor reported: %+v", vs)
	}
	if err := w.checker.Redis0.HSet(ctx, k, "rcpt", -4096, "msg", 17).Err(); err != nil {
		t.Fatal(err)
	}
	vs, budget, err = w.checker.Budgets(ctx)
	if err != nil || invariants(vs) != soak.InvBudgetNegative {
		t.Fatalf("negative receipt bytes: %v %+v", err, vs)
	}
	if got := invariants(soak.BudgetFloor(budget, rec, rec)); got != soak.InvBudgetFloor+","+soak.InvBudgetFloor {
		t.Fatalf("msg and rcpt off the floor: got %q", got)
	}
}

// An application key of a family that must expire, written without a TTL.
func TestCheckerCatchesKeyWithoutTTL(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if err := w.checker.Redis0.Set(ctx, "han:api:idem:{planted}", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if vs, err := w.checker.TTLs(ctx); err != nil || len(vs) != 0 {
		t.Fatalf("keys with a TTL reported: %v %+v", err, vs)
	}
	if err := w.checker.Redis1.Set(ctx, "han:rt:planted", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	vs, err := w.checker.TTLs(ctx)
	w.checker.Redis0.Del(ctx, "han:api:idem:{planted}")
	w.checker.Redis1.Del(ctx, "han:rt:planted")
	if err != nil || invariants(vs) != soak.InvNoTTL || !strings.Contains(vs[0].Detail, "han:rt:planted") {
		t.Fatalf("key without TTL: %v %+v", err, vs)
	}
}
