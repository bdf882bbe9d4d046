package store_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
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
// event and a safety task (what the REST API's send writes): from parallel
// senders (-cpu sets GOMAXPROCS; SetParallelism gives 16 senders per
// GOMAXPROCS) into 20 dialogs and into one dialog, and from one sender
// (one send at a time, its latency). It reports the client round trips per
// send (statements sent, divided by sends) and, where /proc shows the
// private cluster, PostgreSQL's CPU time per send.
func BenchmarkSendMessage(b *testing.B) {
	for _, bc := range []struct {
		name     string
		dialogs  int
		parallel bool
	}{{"dialogs=20", 20, true}, {"dialogs=1", 1, true}, {"serial", 1, false}} {
		b.Run(bc.name, func(b *testing.B) { benchSend(b, bc.dialogs, bc.parallel) })
	}
}

func benchSend(b *testing.B, dialogs int, parallel bool) {
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
	// PostgreSQL's CPU: the postmaster with its live and reaped children.
	var pg loadtest.ProcCPU
	if pm := postmasterPID(b, pool); pm > 0 {
		if err := pg.Set("postgres=" + strconv.Itoa(pm) + "+"); err != nil {
			b.Fatal(err)
		}
	}
	cpuBefore := pg.Sample()
	b.ResetTimer()
	counter.n.Store(0)
	send := func() error {
		i := next.Add(1)
		sender := users[i%senders]
		in := store.SendMessage{ID: ids.New(), DialogID: dlgs[i%int64(dialogs)], SenderID: sender, Body: "benchmark message",
			ClientMessageID: ids.New(), Event: true, SafetyTask: true,
			Idem: &store.IdemWrite[store.Message]{Key: store.IdemKey{Scope: "msg_send", UserID: sender, KeyHMAC: ids.New()},
				Fingerprint: "fp", TTL: time.Hour, Record: func(m store.Message) store.IdemRecord {
					return store.IdemRecord{Status: 201, ResourceID: m.ID, Version: m.Seq}
				}}}
		_, _, _, err := s.SendMessage(ctx, in)
		return err
	}
	if !parallel {
		for i := 0; i < b.N; i++ {
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := send(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "roundtrips/send")
	if perOp := pg.Sample().PerOp(cpuBefore, int64(b.N)); perOp["postgres"] > 0 {
		b.ReportMetric(perOp["postgres"]*1000, "pg-cpu-µs/send")
	}
}

// postmasterPID is the parent of a backend of pool: the private cluster's
// postmaster (0 when /proc cannot tell).
func postmasterPID(b *testing.B, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	f := procStat(backend)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// procStat is /proc/<pid>/stat from field 3 (state) on; nil when unreadable.
func procStat(pid int) []string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(raw)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}
