package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/store"
)

// A lone send costs one client round trip to PostgreSQL, which carries two
// statements: its transaction is one batch (the statement's time limit,
// then send_groups, which checks the membership and the clientMessageId and
// writes the message, its outbox event, its safety task and its idempotency
// record) sent and answered together, and nothing else of the send path
// goes to the server. The round trips are counted on the connection's
// socket (pgCounter), so one more anywhere on the path, a statement of its
// own or a batch split in two, fails this, and BenchmarkSendMessage's
// roundtrips/send reads what this asserts.
func TestSendIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	// One connection, so the send below finds the statements its batch
	// needs prepared: on a connection's first send, in cache_statement
	// mode, pgx prepares them in a round trip of their own.
	cfg.MaxConns = 1
	// The pool pings a connection idle for more than a second before it
	// hands it out: that round trip is the pool's, whatever it is used for,
	// and a slow machine must not add it to the send's.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
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
	st := store.New(pool)
	a, _, dialogID := twoUsers(t, st)
	if _, _, _, err := st.SendMessage(ctx, restSend(dialogID, a)); err != nil {
		t.Fatal(err)
	}

	trips, statements := counter.trips.Load(), counter.statements.Load()
	m, ev, created, err := st.SendMessage(ctx, restSend(dialogID, a))
	if err != nil {
		t.Fatal(err)
	}
	trips, statements = counter.trips.Load()-trips, counter.statements.Load()-statements
	if !created || m.Seq != 2 || ev.EventID == "" {
		t.Fatalf("send: created %v, seq %d, event %q; want a new message with seq 2 and its event", created, m.Seq, ev.EventID)
	}
	if trips != 1 || statements != 2 {
		t.Fatalf("a send took %d round trips carrying %d statements, want 1 carrying 2", trips, statements)
	}
}
