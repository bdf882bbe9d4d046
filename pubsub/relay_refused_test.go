package pubsub_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// One outbox row Redis refuses (here a channel the relay's Redis user may
// not publish on) does not hold back the rows after it: they are published
// in the same run, the refused row is charged an attempt, and after
// OutboxMaxAttempts refusals it is given up (never claimed again, logged
// once with its event id). A Redis that does not answer charges nothing.
func TestRelayGoesPastARowRedisRefuses(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	rdb := serviceChannelsOnly(t)
	logs := &testenv.LogBuffer{}
	relay, err := pubsub.NewRelay(st, rdb, pubsub.RelayConfig{Grace: time.Millisecond, Batch: 1000},
		slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}

	poison := ids.New()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, created_at)
		VALUES ($1, 'elsewhere:x', '{}', now() - interval '1 minute')`, poison); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DELETE FROM outbox WHERE event_id=$1", poison) })
	attempts := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT attempts FROM outbox WHERE event_id=$1", poison).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Redis not answering: the batch ends and nobody is charged.
	dead := deadRelay(t, st)
	if _, _, err := dead.RunOnce(ctx); err == nil {
		t.Fatal("a relay run against a stopped Redis succeeded")
	}
	if n := attempts(); n != 0 {
		t.Fatalf("a Redis that did not answer charged the row %d attempts", n)
	}

	for run := 1; run <= pubsub.OutboxMaxAttempts+2; run++ {
		d := postWithDeadRedis(t, st, pool, 2)
		ch := pubsub.DialogChannel(d)
		if _, _, err := relay.RunOnce(ctx); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if n := pendingFor(t, pool, ch); n != 0 {
			t.Fatalf("run %d: %d rows behind the refused one were not published", run, n)
		}
		if want := min(run, pubsub.OutboxMaxAttempts); attempts() != want {
			t.Fatalf("run %d: the refused row has %d attempts, want %d", run, attempts(), want)
		}
	}
	if n := strings.Count(logs.String(), poison); n != 1 {
		t.Fatalf("the given-up row's event id is in the log %d times, want once: %s", n, logs.String())
	}
	var delivered bool
	if err := pool.QueryRow(ctx, "SELECT delivered_at IS NOT NULL FROM outbox WHERE event_id=$1", poison).Scan(&delivered); err != nil || delivered {
		t.Fatalf("the given-up row is marked delivered (%v, %v)", delivered, err)
	}
}

// deadRelay is a relay whose Redis is stopped.
func deadRelay(t *testing.T, ob pubsub.Outbox) *pubsub.Relay {
	t.Helper()
	rdb, err := rds.NewRedis("redis://127.0.0.1:1/1", rds.RedisConfig{DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	r, err := pubsub.NewRelay(ob, rdb, pubsub.RelayConfig{Grace: time.Millisecond, Batch: 1000, PublishTimeout: 200 * time.Millisecond}, discard)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A batch made only of rows Redis refuses (a channel the relay's user may
// not publish on), with good rows behind it: Redis takes a publish to the
// relay's probe channel, so the refused rows are what it refuses and are
// charged, given up after OutboxMaxAttempts, and the rows behind them go
// out. (They were charged only when another row of their batch was
// published, so such a batch was claimed again and again and the rows
// behind it never went out.)
func TestARelayBatchOfRefusedRowsDoesNotHoldBackTheRest(t *testing.T) {
	st, pool := openStore(t)
	ctx := context.Background()
	rdb := serviceChannelsOnly(t)
	const batch = 3
	relay, err := pubsub.NewRelay(st, rdb, pubsub.RelayConfig{Grace: time.Millisecond, Batch: batch}, discard)
	if err != nil {
		t.Fatal(err)
	}
	var poison []string
	for range batch {
		id := ids.New()
		poison = append(poison, id)
		if _, err := pool.Exec(ctx, `INSERT INTO outbox(event_id, channel, payload, created_at)
			VALUES ($1, 'elsewhere:x', '{}', now() - interval '1 minute')`, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DELETE FROM outbox WHERE event_id = ANY($1::uuid[])", poison) })
	d := postWithDeadRedis(t, st, pool, 2)
	ch := pubsub.DialogChannel(d)
	for range pubsub.OutboxMaxAttempts + 2 {
		_, _, _ = relay.RunOnce(ctx)
	}
	if n := pendingFor(t, pool, ch); n != 0 {
		t.Fatalf("after %d relay runs, %d good rows behind %d refused ones are still unpublished",
			pubsub.OutboxMaxAttempts+2, n, batch)
	}
}

// serviceChannelsOnly is a DB1 client of a Redis user of its own that may
// publish on the service's channels (han:rt:*) only: a row on any other
// channel is refused with an error reply.
func serviceChannelsOnly(t *testing.T) redis.UniversalClient {
	t.Helper()
	ctx := context.Background()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	user := "relay-" + ids.New()[:8]
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels", "&han:rt:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a := env.Redis.AdminClient(1)
		defer a.Close()
		a.Do(context.Background(), "ACL", "DELUSER", user)
	})
	rdb, err := rds.NewRedis("redis://"+user+":pw@"+env.Redis.Addr()+"/1", rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
