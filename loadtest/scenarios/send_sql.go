package scenarios

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store"
)

// SendSQL is the raw baseline of the send path: the store's own send
// function (store.Store.SendMessage, then the delivered mark queued on a
// store.OutboxMarker with the server's defaults, as the gateway does after
// publishing) with the inputs the REST handler gives it
// — the message.created event, the idempotency record, the safety task when
// the legacy stub is on — called directly on a pgx pool opened as the
// gateway opens its own (DATABASE_URL's pool size, HAN_DB_EXEC_MODE,
// HAN_DB_REQUEST_TIMEOUT). No HTTP, no Redis. The shape, the arrival model,
// -step-rates and the history check are chat-fanout's, so the two figures
// compare: what the gateway adds on top of the SQL it must run. Whatever
// SQL the store's send runs, this runs.
type SendSQL struct {
	sf            sendFlags
	databaseURL   string
	execMode      string
	reqTimeout    time.Duration
	idemTTL       time.Duration
	safetyTask    bool
	markDelivered bool
	committers    int
	linger        time.Duration
	getenv        func(string) string
}

// Describe implements Scenario.
func (s *SendSQL) Describe() string {
	return "the send path's SQL alone: store.SendMessage on a pgx pool like the gateway's, same shape and schedule as chat-fanout (PostgreSQL)"
}

// Name implements loadtest.Scenario.
func (s *SendSQL) Name() string { return "send-sql" }

// Flags implements Scenario.
func (s *SendSQL) Flags(fs *flag.FlagSet, getenv func(string) string) {
	s.getenv = getenv
	s.sf.register(fs, false)
	fs.StringVar(&s.databaseURL, "database-url", "", "loopback PostgreSQL URL of a migrated gateway database; pool_max_conns in it sizes the pool as for the gateway (default: env DATABASE_URL)")
	fs.StringVar(&s.execMode, "exec-mode", getenv("HAN_DB_EXEC_MODE"), "pgx exec mode, as the gateway's HAN_DB_EXEC_MODE (env)")
	fs.DurationVar(&s.reqTimeout, "db-request-timeout", envDuration(getenv, "HAN_DB_REQUEST_TIMEOUT", store.DefaultRequestTimeout), "request transaction budget, as the gateway's HAN_DB_REQUEST_TIMEOUT (env)")
	fs.DurationVar(&s.idemTTL, "idempotency-ttl", envDuration(getenv, "HAN_IDEMPOTENCY_TTL", 24*time.Hour), "idempotency record lifetime, as the gateway's HAN_IDEMPOTENCY_TTL (env)")
	stub, _ := strconv.ParseBool(getenv("HAN_LEGACY_STUB_ENABLED"))
	fs.BoolVar(&s.safetyTask, "safety-task", stub, "record each message's safety task, as the gateway does while HAN_LEGACY_STUB_ENABLED (env)")
	committers, _ := strconv.Atoi(getenv("HAN_SEND_COMMITTERS"))
	fs.IntVar(&s.committers, "send-committers", cmp.Or(committers, store.DefaultSendCommitters), "send transactions at once, as the gateway's HAN_SEND_COMMITTERS (env)")
	fs.DurationVar(&s.linger, "send-linger", envDurationOrZero(getenv, "HAN_SEND_LINGER", store.DefaultSendLinger), "how long a send transaction waits for company, as the gateway's HAN_SEND_LINGER (env)")
	fs.BoolVar(&s.markDelivered, "mark-delivered", true, "queue the outbox row's delivered mark on a batching store.OutboxMarker after the send, as the gateway does after its publish")
}

func envDuration(getenv func(string) string, name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// envDurationOrZero is envDuration for a setting where 0 means off.
func envDurationOrZero(getenv func(string) string, name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(getenv(name)); err == nil && d >= 0 {
		return d
	}
	return def
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *SendSQL) DeclareMetrics(reg *loadtest.Registry) { declareSendMetrics(reg) }

// Run implements loadtest.Scenario.
func (s *SendSQL) Run(ctx context.Context, t *loadtest.T) error {
	if err := s.sf.check(); err != nil {
		return loadtest.Usage(err)
	}
	pool, err := s.open(ctx, t)
	if err != nil {
		return err
	}
	defer pool.Close()
	st := store.New(pool)
	st.SetRequestTimeout(s.reqTimeout)
	st.SetSendCommitters(s.committers)
	st.SetSendLinger(s.linger)
	t.Info("send_committers", s.committers)
	t.Info("send_linger", s.linger.String())
	users, dialogs, err := s.prepare(ctx, t, st)
	if err != nil {
		return err
	}
	var marker *store.OutboxMarker
	if s.markDelivered {
		if marker, err = store.NewOutboxMarker(st, store.OutboxMarkerConfig{}, nil); err != nil {
			return err
		}
	}
	r := newSendRun(&s.sf, s.sender(st, marker, users, dialogs), sqlStatusOf)
	t.Reg.ResetClock()
	err = r.measureAll(ctx, t, "send-sql")
	if marker != nil {
		marker.Close() // flushes the marks still queued, inside the measured phase
	}
	t.Reg.StopClock()
	if ss := st.SendStats(); ss.Transactions > 0 {
		t.Info("send_stats", fmt.Sprintf("%d sends in %d transactions (%.2f per transaction, %.2f dialogs)",
			ss.Sends, ss.Transactions, float64(ss.Sends)/float64(ss.Transactions), float64(ss.Batches)/float64(ss.Transactions)))
	}
	if err != nil {
		return err
	}
	return r.reconcile(ctx, t, func(ctx context.Context, d int, after int64) ([]stored, bool, error) {
		items, more, err := st.ListMessages(ctx, dialogs[d], after, 100)
		if err != nil {
			return nil, false, err
		}
		out := make([]stored, len(items))
		for i, m := range items {
			marker, _ := loadtest.ScheduledNanosFromBody(m.Body)
			out[i] = stored{id: m.ID, seq: m.Seq, marker: marker}
		}
		return out, more, nil
	})
}

// open opens the pool as the gateway does (store.OpenPG with the exec
// mode) and reports its settings.
func (s *SendSQL) open(ctx context.Context, t *loadtest.T) (*pgxpool.Pool, error) {
	u := cmp.Or(s.databaseURL, s.getenv("DATABASE_URL"))
	if u == "" {
		return nil, errors.New("send-sql needs -database-url (or DATABASE_URL)")
	}
	if err := checkLoopbackDB(u); err != nil {
		return nil, err
	}
	mode, err := store.ParseExecMode(s.execMode)
	if err != nil {
		return nil, fmt.Errorf("-exec-mode: %w", err)
	}
	pool, err := store.OpenPG(ctx, u, store.PGConfig{ExecMode: mode})
	if err != nil {
		return nil, err
	}
	t.Info("target", "PostgreSQL (store.SendMessage, no HTTP, no Redis)")
	t.Info("pool_max_conns", pool.Config().MaxConns)
	t.Info("exec_mode", pool.Config().ConnConfig.DefaultQueryExecMode.String())
	t.Info("safety_task", s.safetyTask)
	t.Info("mark_delivered", s.markDelivered)
	return pool, nil
}

// checkLoopbackDB refuses a PostgreSQL that is not on this machine. A
// URL with several hosts makes pgx try each in turn, so every one of them
// (the first and the fallbacks) must be loopback or a Unix socket.
func checkLoopbackDB(u string) error {
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return errors.New("-database-url: not a PostgreSQL URL")
	}
	hosts := []string{cfg.ConnConfig.Host}
	for _, fb := range cfg.ConnConfig.Fallbacks {
		hosts = append(hosts, fb.Host)
	}
	for _, h := range hosts {
		if len(h) > 0 && h[0] == '/' {
			continue // a Unix socket
		}
		if err := loadtest.CheckLoopbackHost(h); err != nil {
			return err
		}
	}
	return nil
}

// prepare records the users and creates the dialogs of the shape, as the
// gateway's GET /v1/me and POST /v1/dialogs do.
func (s *SendSQL) prepare(ctx context.Context, t *loadtest.T, st *store.Store) ([]string, []string, error) {
	sh := s.sf.shape()
	users := make([]string, sh.conns)
	for i := range users {
		users[i] = ids.New()
	}
	t.SetPhase("setup: users")
	if err := forEach(ctx, len(users), s.sf.concurrency, func(ctx context.Context, i int) error {
		return st.EnsureUser(ctx, users[i])
	}); err != nil {
		return nil, nil, err
	}
	members := sh.members()
	dialogs := make([]string, sh.dialogs)
	t.SetPhase("setup: dialogs")
	err := forEach(ctx, len(members), s.sf.concurrency, func(ctx context.Context, d int) error {
		others := make([]string, 0, len(members[d])-1)
		for _, c := range members[d][1:] {
			others = append(others, users[c])
		}
		dl, err := st.CreateDialog(ctx, ids.New(), users[members[d][0]], "loadtest", others)
		dialogs[d] = dl.ID
		return err
	})
	return users, dialogs, err
}

// sender is the send as the REST handler makes it: a fresh message id, the
// message.created event, the idempotency record of a fresh key (the key's
// HMAC and the request fingerprint are 64 hex digits, as the handler's).
func (s *SendSQL) sender(st *store.Store, marker *store.OutboxMarker, users, dialogs []string) sendFunc {
	return func(ctx context.Context, d, sender int, body string) (string, int64, error) {
		in := store.SendMessage{ID: ids.New(), DialogID: dialogs[d], SenderID: users[sender], Body: body, Event: true,
			SafetyTask: s.safetyTask,
			Idem: &store.IdemWrite[store.Message]{
				Key:         store.IdemKey{Scope: "msg_send", UserID: users[sender], KeyHMAC: randomHex64()},
				Fingerprint: randomHex64(), TTL: s.idemTTL,
				Record: func(m store.Message) store.IdemRecord {
					return store.IdemRecord{Status: http.StatusCreated, ResourceID: m.ID, Version: m.Seq}
				},
			}}
		m, ev, _, err := st.SendMessage(ctx, in)
		if err != nil {
			return "", 0, err
		}
		if marker != nil && ev.EventID != "" {
			marker.Mark(ev.EventID)
		}
		return m.ID, m.Seq, nil
	}
}

func randomHex64() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sqlStatusOf labels a failed send with the status the gateway would
// answer: 503 when the database was busy (the request budget ran out), 404
// for a dialog the sender is not in, else the error's kind (store.Kind).
func sqlStatusOf(err error) string {
	switch {
	case store.IsDatabaseBusy(err):
		return "503"
	case errors.Is(err, store.ErrDialogNotFound):
		return "404"
	}
	return store.Kind(err)
}
