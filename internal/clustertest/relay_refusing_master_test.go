package clustertest_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// On a Redis Cluster one master may refuse every publish (its ACL, a node
// in trouble) while the others take them. A row whose channel lives on
// that master is not what Redis refuses: the relay must neither charge it
// nor give it up, however many runs go by; those runs fail instead, the
// row stays pending and is delivered once the master takes publishes
// again. Meanwhile the rows of the other masters are published, those
// claimed after the held row too (one master failing is not the cluster
// failing: the held row ended the batch, and a master refusing publishes
// held back every row of the cluster behind its own), and a row Redis
// refuses alone (a channel outside the service's prefix, on a master that
// takes publishes) is still charged and given up after OutboxMaxAttempts
// runs. The master chosen is not the one of the channel
// han:rt:relay-probe: a probe on one fixed channel goes to one master,
// which takes it whatever the row's master does. The same in sharded and
// classic Pub/Sub: a PUBLISH too goes to the master of its channel's slot.
func TestRelayChargesNoRowOfAMasterThatRefusesPublishes(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{Replicas: -1})
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fixedProbe, err := c.MasterOf(ctx, "han:rt:relay-probe")
	if err != nil {
		t.Fatal(err)
	}
	var victim, healthy *testenv.RedisServer
	for _, m := range c.Nodes[:c.Opts.Masters] {
		switch {
		case m == fixedProbe:
		case victim == nil:
			victim = m
		default:
			healthy = m
		}
	}
	for _, mode := range []rds.PubSubMode{rds.PubSubSharded, rds.PubSubClassic} {
		t.Run(mode.String(), func(t *testing.T) {
			relayPastARefusingMaster(t, c, store.New(pool), pool, mode, victim, healthy)
		})
	}
}

func relayPastARefusingMaster(t *testing.T, c *testenv.RedisCluster, st *store.Store, pool *pgxpool.Pool,
	mode rds.PubSubMode, victim, healthy *testenv.RedisServer) {
	ctx := context.Background()
	relay, err := pubsub.NewRelay(st, open(t, c), pubsub.RelayConfig{Grace: time.Millisecond, Mode: mode},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// Rows other tests left pending are published (or given up) first, so
	// that every later batch holds this test's rows alone.
	testenv.Eventually(t, 20*time.Second, func() bool {
		claimed, _, _ := relay.RunOnce(ctx)
		return claimed == 0
	}, "the relay did not drain the rows pending before the test")

	good := sendOn(t, c, st, healthy)
	refusedAlone := ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, created_at)
		VALUES ($1, $2, '{}', now() - interval '1 minute')`, refusedAlone, channelOn(t, c, healthy, "elsewhere:")); err != nil {
		t.Fatal(err)
	}
	held := sendOn(t, c, st, victim)
	heldSub := subscribeOn(t, victim, mode, held.Channel)
	// A row of a master that takes publishes, after the held one: the
	// held row does not hold it back.
	after := sendOn(t, c, st, healthy)

	refusePublishes(t, victim)
	failed := 0
	for range pubsub.OutboxMaxAttempts + 2 {
		if _, _, err := relay.RunOnce(ctx); err != nil {
			failed++
		}
	}
	if attempts, delivered := rowState(t, pool, held.EventID); attempts != 0 || delivered {
		t.Fatalf("a row of the master refusing every publish was charged %d attempts (delivered %v): "+
			"it is not what Redis refuses", attempts, delivered)
	}
	if failed != pubsub.OutboxMaxAttempts+2 {
		t.Errorf("%d of %d runs failed while a master refused every publish, want all", failed, pubsub.OutboxMaxAttempts+2)
	}
	for _, ev := range []store.OutboxEvent{good, after} {
		if _, delivered := rowState(t, pool, ev.EventID); !delivered {
			t.Error("a row of a master that takes publishes was not delivered while another master refused every publish")
		}
	}
	if attempts, delivered := rowState(t, pool, refusedAlone); attempts != pubsub.OutboxMaxAttempts || delivered {
		t.Errorf("the row Redis refuses alone has %d attempts (delivered %v), want %d: given up",
			attempts, delivered, pubsub.OutboxMaxAttempts)
	}

	takePublishes(t, victim)
	if _, _, err := relay.RunOnce(ctx); err != nil {
		t.Fatalf("relay run once the master takes publishes again: %v", err)
	}
	if _, delivered := rowState(t, pool, held.EventID); !delivered {
		t.Fatal("the held row was not delivered once its master took publishes again")
	}
	msg, err := heldSub.ReceiveTimeout(ctx, 5*time.Second)
	if err != nil {
		t.Fatalf("the held row's event did not reach its channel: %v", err)
	}
	if m, ok := msg.(*redis.Message); !ok || !strings.Contains(m.Payload, held.EventID) {
		t.Fatalf("the held row's channel got %v, want its event %s", msg, held.EventID)
	}
}

// sendOn commits a message with its outbox event, never published, in a
// new dialog whose channel lives on master m.
func sendOn(t *testing.T, c *testenv.RedisCluster, st *store.Store, m *testenv.RedisServer) store.OutboxEvent {
	t.Helper()
	ctx := context.Background()
	a, b := ids.New(), ids.New()
	for _, u := range []string{a, b} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	dialog := strings.TrimPrefix(channelOn(t, c, m, pubsub.DialogChannel("")), pubsub.DialogChannel(""))
	if _, err := st.CreateDialog(ctx, dialog, a, "", []string{b}); err != nil {
		t.Fatal(err)
	}
	_, ev, created, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: dialog, SenderID: a,
		Body: "held back?", Event: true})
	if err != nil || !created {
		t.Fatalf("send: created %v: %v", created, err)
	}
	return ev
}

// channelOn is prefix followed by a new id, chosen so that the channel
// lives on master m.
func channelOn(t *testing.T, c *testenv.RedisCluster, m *testenv.RedisServer, prefix string) string {
	t.Helper()
	for range 1000 {
		ch := prefix + ids.New()
		owner, err := c.MasterOf(context.Background(), ch)
		if err != nil {
			t.Fatal(err)
		}
		if owner == m {
			return ch
		}
	}
	t.Fatalf("no channel of %s in 1000 tries", m.Addr())
	return ""
}

// subscribeOn subscribes an admin connection of master m to channel the
// way mode's subscribers listen; it is closed when the test ends.
func subscribeOn(t *testing.T, m *testenv.RedisServer, mode rds.PubSubMode, channel string) *redis.PubSub {
	t.Helper()
	ctx := context.Background()
	admin := m.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	var sub *redis.PubSub
	if mode == rds.PubSubClassic {
		sub = admin.Subscribe(ctx, channel)
	} else {
		sub = admin.SSubscribe(ctx, channel)
	}
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	return sub
}

// refusePublishes takes every channel from api_backend on master m alone
// (the ACL of a node is its own): m answers the service's publishes with
// an error reply while the other masters take them. Undone when the test
// ends.
func refusePublishes(t *testing.T, m *testenv.RedisServer) {
	t.Helper()
	admin := m.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(context.Background(), "acl", "setuser", rds.APIBackendUser, "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { takePublishes(t, m) })
}

// takePublishes gives api_backend its channels back on master m.
func takePublishes(t *testing.T, m *testenv.RedisServer) {
	t.Helper()
	admin := m.AdminClient(0)
	defer admin.Close()
	args := []any{"acl", "setuser", rds.APIBackendUser}
	for _, p := range rds.APIBackendChannelPatterns {
		args = append(args, "&"+p)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// rowState is how many attempts the outbox row of eventID was charged and
// whether it was delivered.
func rowState(t *testing.T, pool *pgxpool.Pool, eventID string) (attempts int, delivered bool) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT attempts, delivered_at IS NOT NULL FROM outbox
		WHERE event_id = $1`, eventID).Scan(&attempts, &delivered); err != nil {
		t.Fatal(err)
	}
	return attempts, delivered
}
