package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true}, &env)
}

func openStore(t testing.TB) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return store.New(pool), pool
}

// twoUsers creates two users and a dialog of theirs (created by a).
func twoUsers(t testing.TB, st *store.Store) (a, b, dialogID string) {
	t.Helper()
	ctx := context.Background()
	a, b = ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), a, "", []string{b})
	if err != nil {
		t.Fatal(err)
	}
	return a, b, d.ID
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	_, pool := openStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := store.Migrate(ctx, pool)
			if err == nil && len(applied) != 0 {
				err = errors.New("a second run applied migrations again")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"users", "dialogs", "dialog_members", "messages", "idempotency_records", "outbox", "projects", "project_members"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing (%v)", table, err)
		}
	}
}

func TestSendMessageOutboxInSameTransaction(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), a, "", []string{b, a})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.MemberIDs) != 2 {
		t.Fatalf("members must be deduplicated: %v", d.MemberIDs)
	}
	// A write of the send transaction that fails (here the idempotency
	// record, whose key already holds a live record) rolls back the
	// message, its seq and its outbox event.
	k := store.IdemKey{Scope: "msg_send", UserID: a, KeyHMAC: "taken"}
	if err := insertIdem(t, pool, k, store.IdemRecord{Fingerprint: "fp", Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	_, _, _, err = st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: a, Body: "x", Event: true,
		Idem: &store.IdemWrite[store.Message]{Key: k, Fingerprint: "fp2", TTL: time.Hour,
			Record: func(m store.Message) store.IdemRecord { return store.IdemRecord{Status: 201, ResourceID: m.ID} }}})
	if !errors.Is(err, store.ErrIdemExists) {
		t.Fatalf("want ErrIdemExists, got %v", err)
	}
	var msgs, seq int64
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM messages WHERE dialog_id=$1", d.ID).Scan(&msgs)
	_ = pool.QueryRow(ctx, "SELECT last_seq FROM dialogs WHERE id=$1", d.ID).Scan(&seq)
	var events int64
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE channel=$1", "han:rt:dialog:"+d.ID).Scan(&events)
	if msgs != 0 || seq != 0 || events != 0 {
		t.Fatalf("a failed write must roll the send back: %d messages, last_seq %d, %d events", msgs, seq, events)
	}
	m, ev, created, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: a, Body: "y", Event: true})
	if err != nil || !created || m.Seq != 1 || ev.EntityID != m.ID {
		t.Fatalf("send: %+v %+v %v %v", m, ev, created, err)
	}
	var pending bool
	if err := pool.QueryRow(ctx, "SELECT delivered_at IS NULL FROM outbox WHERE event_id=$1", ev.EventID).Scan(&pending); err != nil || !pending {
		t.Fatalf("outbox row must exist and be pending until published (%v)", err)
	}
	if err := st.MarkOutboxDelivered(ctx, ev.EventID); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: ids.New(), Body: "z"}); !errors.Is(err, store.ErrDialogNotFound) {
		t.Fatalf("non-member send: want ErrDialogNotFound, got %v", err)
	}
}

func TestProjectRoles(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	p, u, other := ids.New(), ids.New(), ids.New()
	if err := st.CreateProject(ctx, p, "p", []store.ProjectMember{{UserID: u, Role: store.RoleWrite}}); err != nil {
		t.Fatal(err)
	}
	// Repeating upgrades the role and keeps one membership.
	if err := st.CreateProject(ctx, p, "p2", []store.ProjectMember{{UserID: u, Role: store.RoleAdmin}}); err != nil {
		t.Fatal(err)
	}
	if role, err := st.ProjectRole(ctx, p, u); err != nil || role != store.RoleAdmin {
		t.Fatalf("role: %q %v", role, err)
	}
	if role, err := st.ProjectRole(ctx, p, other); err != nil || role != "" {
		t.Fatalf("non-member: %q %v", role, err)
	}
	if _, err := st.ProjectRole(ctx, ids.New(), u); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown project: %v", err)
	}
	if err := st.CreateProject(ctx, p, "p", []store.ProjectMember{{UserID: u, Role: "owner"}}); !errors.Is(err, store.ErrInvalidRole) {
		t.Fatalf("invalid role: %v", err)
	}
	// CreateNewProject refuses an id a project has and changes nothing.
	if err := st.CreateNewProject(ctx, p, "p3", []store.ProjectMember{{UserID: u, Role: store.RoleRead}}); !errors.Is(err, store.ErrProjectExists) {
		t.Fatalf("CreateNewProject of an existing id: %v, want ErrProjectExists", err)
	}
	if role, err := st.ProjectRole(ctx, p, u); err != nil || role != store.RoleAdmin {
		t.Fatalf("role after a refused CreateNewProject: %q %v", role, err)
	}
	fresh := ids.New()
	if err := st.CreateNewProject(ctx, fresh, "new", []store.ProjectMember{{UserID: other, Role: store.RoleRead}}); err != nil {
		t.Fatal(err)
	}
	if role, err := st.ProjectRole(ctx, fresh, other); err != nil || role != store.RoleRead {
		t.Fatalf("role in a new project: %q %v", role, err)
	}
}

func TestClassifyRedisError(t *testing.T) {
	ctx := context.Background()
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := rds.NewRedis(r.URL(0), rds.RedisConfig{ReadTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "outside", "v", 0).Err(); !errors.Is(rds.ClassifyRedisError(err), rds.ErrRedisNoPerm) {
		t.Fatalf("NOPERM: %v", err)
	}
	r.Stop()

	err = c.Get(ctx, "han:api:x").Err()
	if !errors.Is(rds.ClassifyRedisError(err), rds.ErrRedisUnavailable) {
		t.Fatalf("a stopped server must classify as unavailable, got %v", err)
	}
	if _, err := rds.NewRedis("redis://api_backend:hunter2@[bad", rds.RedisConfig{}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a bad URL must fail without echoing it: %v", err)
	}

}

// The send writes the message, its seq, the message.created event, the
// safety task and the idempotency record in one transaction the caller
// only describes: all of them commit together, and a failing part (a key
// that already holds a live record) leaves none of them behind.
func TestSendMessageComposesItsTransaction(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	a, _, dialogID := twoUsers(t, st)
	k := store.IdemKey{Scope: "msg_send", UserID: a, KeyHMAC: "composed"}
	send := func(id string) (store.Message, store.OutboxEvent, error) {
		m, ev, _, err := st.SendMessage(ctx, store.SendMessage{ID: id, DialogID: dialogID, SenderID: a, Body: "hello",
			Event: true, SafetyTask: true,
			Idem: &store.IdemWrite[store.Message]{Key: k, Fingerprint: "fp", TTL: time.Hour,
				Record: func(m store.Message) store.IdemRecord {
					return store.IdemRecord{Status: 201, ResourceID: m.ID, Version: m.Seq}
				}}})
		return m, ev, err
	}
	m, ev, err := send(ids.New())
	if err != nil {
		t.Fatal(err)
	}
	var frame struct {
		Type, Event, EntityID, DialogID string
		Seq                             int64
		Data                            struct{ ID, Body string }
	}
	if err := json.Unmarshal(ev.Payload, &frame); err != nil || frame.Type != "event" || frame.Event != "message.created" ||
		frame.EntityID != m.ID || frame.DialogID != dialogID || frame.Seq != m.Seq || frame.Data.ID != m.ID || frame.Data.Body != "hello" {
		t.Fatalf("event frame %s (%v)", ev.Payload, err)
	}
	if ev.Channel != "han:rt:dialog:"+dialogID {
		t.Fatalf("event channel %q", ev.Channel)
	}
	if _, err := st.StubTask(ctx, m.ID); err != nil {
		t.Fatalf("safety task of the sent message: %v", err)
	}
	rec, found, err := st.LookupIdempotency(ctx, k)
	if err != nil || !found || rec.ResourceID != m.ID || rec.Version != m.Seq || rec.Fingerprint != "fp" {
		t.Fatalf("idempotency record %+v found=%v: %v", rec, found, err)
	}

	second := ids.New()
	if _, _, err := send(second); !errors.Is(err, store.ErrIdemExists) {
		t.Fatalf("a second send under a live key: %v", err)
	}
	var msgs, events int64
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM messages WHERE dialog_id=$1", dialogID).Scan(&msgs)
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE entity_id=$1", second).Scan(&events)
	if msgs != 1 || events != 0 {
		t.Fatalf("the refused send left %d messages (want 1) and %d events", msgs, events)
	}
	if _, err := st.StubTask(ctx, second); !errors.Is(err, store.ErrStubTaskNotFound) {
		t.Fatalf("the refused send left a safety task: %v", err)
	}
}
