package legacystub_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true,
		RedisOpt: testenv.RedisOptions{LegacyStubPassword: "stub-test-password"}}, &env)
}

type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *store.Store
	db1   redis.UniversalClient // api_backend, DB1
	db2   redis.UniversalClient // legacy_stub, DB2
	admin *redis.Client         // DB2, unrestricted
	stub  *legacystub.Stub
	users [2]string
	dlg   string
}

var migrated bool

func newFixture(t *testing.T, cfg legacystub.Config) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if !migrated {
		if _, err := store.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		migrated = true
	}
	db1, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db2, err := rds.NewRedis(env.Redis.LegacyStubURL(2), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	admin := env.Redis.AdminClient(2)
	t.Cleanup(func() { db1.Close(); db2.Close(); admin.Close() })
	f := &fixture{t: t, pool: pool, store: store.New(pool), db1: db1, db2: db2, admin: admin}
	f.stub, err = legacystub.New(cfg, legacystub.Deps{DB2: db2, Store: f.store})
	if err != nil {
		t.Fatal(err)
	}
	for i := range f.users {
		f.users[i] = ids.New()
		if err := f.store.EnsureUser(ctx, f.users[i]); err != nil {
			t.Fatal(err)
		}
	}
	d, err := f.store.CreateDialog(ctx, ids.New(), f.users[0], "stub", []string{f.users[1]})
	if err != nil {
		t.Fatal(err)
	}
	f.dlg = d.ID
	return f
}

// send commits a message with its safety task (as the API does) and
// returns its id; start also writes the DB2 task, as the API does after
// the commit.
func (f *fixture) send(start bool) string {
	f.t.Helper()
	ctx := context.Background()
	m, _, _, err := f.store.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dlg, SenderID: f.users[0], Body: "hi",
		SafetyTask: true})
	if err != nil {
		f.t.Fatal(err)
	}
	if start {
		f.stub.Start(ctx, m.ID)
	}
	return m.ID
}

// age makes tasks look created long ago (stuck past the poll budget).
func (f *fixture) age(messageIDs ...string) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(),
		"UPDATE stub_tasks SET created_at = now() - interval '10 minutes' WHERE message_id = ANY($1::uuid[])", messageIDs); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) task(id string) store.StubTask {
	f.t.Helper()
	t, err := f.store.StubTask(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return t
}
