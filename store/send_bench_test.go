package store_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// statementCounter counts the statements a pool sends: each is one client
// round trip to PostgreSQL (pgx sends a statement and waits for its answer).
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// BenchmarkSendMessage sends messages with an idempotency record, an outbox
// event and a safety task (what the REST API's send writes) from parallel
// senders (-cpu sets GOMAXPROCS; SetParallelism gives 16 senders per
// GOMAXPROCS) into 20 dialogs and into one dialog. It reports the client
// round trips per send (statements sent, divided by sends).
func BenchmarkSendMessage(b *testing.B) {
	for _, bc := range []struct {
		name    string
		dialogs int
	}{{"dialogs=20", 20}, {"dialogs=1", 1}} {
		b.Run(bc.name, func(b *testing.B) { benchSend(b, bc.dialogs) })
	}
}

func benchSend(b *testing.B, dialogs int) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.DatabaseURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 20
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	s := store.New(pool)
	const senders = 50
	users := make([]string, senders)
	for i := range users {
		users[i] = ids.New()
		if err := s.EnsureUser(ctx, users[i]); err != nil {
			b.Fatal(err)
		}
	}
	dlgs := make([]string, dialogs)
	for i := range dlgs {
		d, err := s.CreateDialog(ctx, ids.New(), users[0], "bench", users[1:])
		if err != nil {
			b.Fatal(err)
		}
		dlgs[i] = d.ID
	}
	var next atomic.Int64
	b.SetParallelism(16)
	b.ResetTimer()
	counter.n.Store(0)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			sender := users[i%senders]
			in := store.SendMessage{ID: ids.New(), DialogID: dlgs[i%int64(dialogs)], SenderID: sender, Body: "benchmark message",
				ClientMessageID: ids.New(), Event: true, SafetyTask: true,
				Idem: &store.IdemWrite[store.Message]{Key: store.IdemKey{Scope: "msg_send", UserID: sender, KeyHMAC: ids.New()},
					Fingerprint: "fp", TTL: 3600e9, Record: func(m store.Message) store.IdemRecord {
						return store.IdemRecord{Status: 201, ResourceID: m.ID, Version: m.Seq}
					}}}
			if _, _, _, err := s.SendMessage(ctx, in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "roundtrips/send")
}
