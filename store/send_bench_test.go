package store_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store"
)

// pgCounter counts what a pool's connections send to PostgreSQL once they
// are open (their startup is not counted).
//
// trips are the client round trips, counted on each connection's socket: a
// round trip is the client writing and then reading the answer, however
// many statements the write carried (a statement alone, or a batch or
// pipeline up to its sync) and whatever sent it (a statement, the round trip
// in which pgx prepares a batch's statements that a connection has not
// prepared yet in cache_statement mode, the pool's liveness ping). pgx's
// tracer hooks cannot give this: they see no such preparation and no ping,
// and a batch is one call to them whatever it costs on the wire.
//
// statements are the statements run: each Query, QueryRow and Exec, and
// each statement queued in a batch (through pgx's tracer hooks).
type pgCounter struct {
	trips, statements atomic.Int64
}

// count makes the connections of cfg's pool count into c.
func (c *pgCounter) count(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = c
	cfg.ConnConfig.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, conn net.Conn) (net.Conn, error) {
		return &tripConn{Conn: conn, trips: &c.trips}, nil
	}
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		if tc, ok := conn.PgConn().Conn().(*tripConn); ok {
			tc.open.Store(true)
		}
		return nil
	}
}

func (c *pgCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *pgCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *pgCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	c.statements.Add(int64(data.Batch.Len()))
	return ctx
}

func (c *pgCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *pgCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tripConn is a connection to PostgreSQL that counts its round trips once
// open: the first read of an answer after the client wrote counts one.
// Whether a write is pending is noted before the write starts, so an answer
// that pgx's background reader takes in while a long write is still under
// way is counted too, and once.
type tripConn struct {
	net.Conn
	trips *atomic.Int64
	// open: the startup is over (pgxpool's AfterConnect).
	open atomic.Bool
	// wrote: the client wrote since the last answer was read.
	wrote atomic.Bool
}

func (c *tripConn) Write(p []byte) (int, error) {
	c.wrote.Store(true)
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.wrote.Swap(false) && c.open.Load() {
		c.trips.Add(1)
	}
	return n, err
}

// BenchmarkSendMessage sends messages with an idempotency record, an outbox
// event and a safety task (what the REST API's send writes): from parallel
// senders (-cpu sets GOMAXPROCS; SetParallelism gives 16 senders per
// GOMAXPROCS) into 20 dialogs and into one dialog, and from one sender
// (one send at a time, its latency). It reports the client round trips and
// the statements per send (pgCounter: a send transaction is one round trip
// that carries two statements, shared by the sends it writes) and, where
// /proc shows the private cluster, PostgreSQL's CPU time per send.
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
	counter := &pgCounter{}
	counter.count(cfg)
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
	counter.trips.Store(0)
	counter.statements.Store(0)
	send := func() error {
		i := next.Add(1)
		_, _, _, err := s.SendMessage(ctx, restSend(dlgs[i%int64(dialogs)], users[i%senders]))
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
	b.ReportMetric(float64(counter.trips.Load())/float64(b.N), "roundtrips/send")
	b.ReportMetric(float64(counter.statements.Load())/float64(b.N), "statements/send")
	if perOp := pg.Sample().PerOp(cpuBefore, int64(b.N)); perOp["postgres"] > 0 {
		b.ReportMetric(perOp["postgres"]*1000, "pg-cpu-µs/send")
	}
}

// restSend is what the REST API's send writes: a message with a
// clientMessageId, its outbox event, its safety task and the request's
// idempotency record.
func restSend(dialogID, sender string) store.SendMessage {
	return store.SendMessage{ID: ids.New(), DialogID: dialogID, SenderID: sender, Body: "benchmark message",
		ClientMessageID: ids.New(), Event: true, SafetyTask: true,
		Idem: &store.IdemWrite[store.Message]{Key: store.IdemKey{Scope: "msg_send", UserID: sender, KeyHMAC: ids.New()},
			Fingerprint: "fp", TTL: time.Hour, Record: func(m store.Message) store.IdemRecord {
				return store.IdemRecord{Status: 201, ResourceID: m.ID, Version: m.Seq}
			}}}
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
