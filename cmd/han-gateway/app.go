package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/config"
	"github.com/han-app/gateway/internal/wsedge"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
	"github.com/han-app/gateway/web"
)

// Main is the program: ParseFlags, Run (returns once serving), Close
// (graceful drain). End-to-end tests drive it on 127.0.0.1:0.
type Main struct {
	Config config.Config
	Logger *slog.Logger
	// Migrate applies migrations at start-up (flag -migrate, default true).
	Migrate bool
	// Debug serves /debug/memstats and /debug/pprof/ to loopback peers
	// (HAN_DEBUG_ENDPOINTS=true or -debug-endpoints; debug.go).
	Debug bool

	addr     string // bound address after Run
	pg       *pgxpool.Pool
	readyPG  *pgxpool.Pool // readiness probe's own connection
	rdb      redis.UniversalClient
	rt       redis.UniversalClient
	api      *restapi.Server
	realtime *gateway.Service
	verifier *auth.Verifier            // its Close ends a detached JWKS refetch
	janitor  *store.Janitor            // purges expired idempotency records
	purger   *store.OutboxPurger       // purges delivered outbox rows past HAN_OUTBOX_RETENTION
	budgets  *project.BudgetReconciler // reconciles the project API's module budget
	ops      opsParts                  // runtime settings and the legacy stub (ops.go)
	httpSrv  *http.Server
	edge     *wsedge.Listener
	// stopped closes when the server's Serve returns; serveErr is what it
	// returned (read after stopped).
	stopped  chan struct{}
	serveErr error
	metrics  metricsListener // HAN_METRICS_ADDR (metrics_listener.go)
	// presenceJitter, when set, draws the jitter of the presence loops'
	// sleeps (presence.Config.Jitter): tests pin the liveness refreshes to
	// their longest gap. Nil: random.
	presenceJitter func(spread time.Duration) time.Duration
}

const usage = `usage: han-gateway [flags]

Serves the WebSocket gateway, the REST API, the web client and /metrics of
one instance until SIGTERM or SIGINT, then drains (see README.md).

Environment (README.md has the full table):
  REDIS_URL                 required: Redis DB0, e.g. redis://api_backend:<pw>@host:6379/0
  REDIS_REALTIME_URL        required: Redis DB1
  DATABASE_URL              required: PostgreSQL
  HAN_HMAC_SECRET           required: at least 16 bytes
  HAN_JWKS_URL / HAN_JWKS_FILE, or HAN_JWT_DEV_HS256_SECRET (not with HAN_ENV=prod)
  HAN_PUBLIC_REALTIME_URL   required when HAN_ENV=prod
  HAN_HTTP_ADDR             listen address (default 127.0.0.1:8080)
  HAN_METRICS_ADDR          serve /metrics on this address instead
  HAN_DRAIN_DELAY           on SIGTERM, serve this long with /readyz 503 (default 5s)
  HAN_SHUTDOWN_TIMEOUT      then drain sockets and requests within this (default 15s)
  HAN_BLOB_DIR              attachment folder (default <temp dir>/han-blobs)

Flags:
`

// NewMain returns a Main with defaults.
func NewMain() *Main { return &Main{Migrate: true} }

// ParseFlags reads the environment through getenv; flags override it.
func (m *Main) ParseFlags(args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("han-gateway", flag.ContinueOnError)
	// Help goes to stdout and a bad flag's message only to the caller,
	// which prints it once.
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", "", "listen address (overrides HAN_HTTP_ADDR)")
	migrate := fs.Bool("migrate", true, "apply database migrations at start-up")
	debugOn, err := debugEndpoints(getenv) // startcheck.go
	if err != nil {
		return err
	}
	debug := fs.Bool("debug-endpoints", debugOn, "serve /debug/memstats and /debug/pprof/ to loopback peers ("+debugEnv+"=true)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Fprint(os.Stdout, usage)
			fs.PrintDefaults()
		}
		return err
	}
	env := getenv
	if *addr != "" { // -addr is checked as HAN_HTTP_ADDR is
		env = func(k string) string {
			if k == "HAN_HTTP_ADDR" {
				return *addr
			}
			return getenv(k)
		}
	}
	cfg, err := config.Load(env)
	if err != nil {
		return err
	}
	m.Config, m.Migrate, m.Debug = cfg, *migrate, *debug
	return nil
}

// Addr is the listening address once Run returned. The program logs m.addr
// itself; the tests, which drive the real Main, read it here.
func (m *Main) Addr() string { return m.addr }

// URL is the base URL of the running server, for the tests that drive the
// real Main.
func (m *Main) URL() string { return "http://" + m.addr }

// Stopped is closed when the listener stops serving on its own, outside
// Close: an accept error Go does not retry (ENOBUFS, ENOMEM, a closed
// socket) ends net/http's Serve, and an instance left running without a
// listener would serve nothing while it looked alive. The error says why.
// nil before Run has started serving.
func (m *Main) Stopped() (<-chan struct{}, func() error) {
	return m.stopped, func() error { return m.serveErr }
}

// Run connects to the dependencies, migrates, checks that the schema has
// every migration the binary knows (schema.go) and starts serving. It does
// not wait for Redis: an instance starts (degraded) while Redis is down.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config
	if m.Logger == nil {
		m.Logger = newLogger(cfg.LogLevel)
	}
	rds.SetRedisLogger(m.Logger)
	m.warnConfig() // startcheck.go
	if err := m.checkLegacyStub(); err != nil {
		return err
	}
	mode, err := store.ParseExecMode(cfg.DBExecMode)
	if err != nil {
		return fmt.Errorf("HAN_DB_EXEC_MODE: %w", err)
	}
	m.pg, err = store.OpenPG(ctx, cfg.DatabaseURL, store.PGConfig{ExecMode: mode})
	if err != nil {
		return err
	}
	if m.readyPG, err = store.OpenReadinessPG(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	if m.Migrate {
		if err := migrateDirect(ctx, cfg.DatabaseDirectURL, directURLName(cfg), m.Logger); err != nil {
			return err
		}
	}
	if err := m.checkSchema(ctx); err != nil { // schema.go
		return err
	}
	rc := rds.RedisConfig{ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout, PoolTimeout: cfg.RedisTimeout,
		DialTimeout: cfg.RedisTimeout, ClientName: "han-gateway:" + cfg.InstanceID}
	if m.rdb, err = rds.NewRedis(cfg.RedisURL, rc); err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	if m.rt, err = rds.NewRedis(cfg.RedisRealtimeURL, rc); err != nil {
		return fmt.Errorf("REDIS_REALTIME_URL: %w", err)
	}
	psMode, err := rds.ParsePubSubMode(cfg.PubSubMode)
	if err == nil {
		_, err = rds.ShardedPubSub(m.rt, psMode)
	}
	if err != nil {
		return fmt.Errorf("HAN_PUBSUB_MODE=%s: %w", cfg.PubSubMode, err)
	}
	lctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
	if err := lua.LoadAll(lctx, m.rdb); err != nil {
		m.Logger.Warn("redis not ready at start-up; scripts load on first use", slog.String("kind", fmt.Sprintf("%T", errors.Unwrap(err))))
	}
	cancel()

	verifier, err := auth.NewVerifier(ctx, auth.Config{
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, JWKSURL: cfg.JWKSURL, JWKSFile: cfg.JWKSFile,
		DevHS256Secret: []byte(cfg.DevHS256Secret), Env: cfg.Env, Redis: m.rdb,
	}, m.Logger)
	if err != nil {
		return err
	}
	m.verifier = verifier
	metrics := restapi.NewMetrics()
	metrics.Registry.MustRegister(newOpsCollector(store.New(m.pg), m.rdb, m.rt, cfg.RedisTimeout)) // metrics.go
	metrics.Registry.MustRegister(newPoolCollector(m.pg))                                          // dbpool.go
	metrics.Registry.MustRegister(newBuildInfo())
	if err := m.startSettings(ctx, metrics); err != nil {
		return err
	}
	limits, err := ratelimit.New(ratelimit.Config{Redis: m.rdb, Timeout: cfg.RedisTimeout, Registerer: metrics.Registry, Logger: m.Logger,
		Policies: m.ops.settings})
	if err != nil {
		return err
	}
	// One store for the API and the realtime service: they share its
	// batched reads and the set of users already recorded.
	apiStore := store.New(m.pg)
	apiStore.SetRequestTimeout(cfg.DBRequestTimeout)
	apiStore.SetSendQueue(cfg.SendDialogQueue)
	apiStore.SetSendCommitters(m.sendCommitters()) // startcheck.go
	apiStore.SetSendLinger(cfg.SendLinger)
	apiStore.SetRealtimeLinger(cfg.WSLinger)
	metrics.Registry.MustRegister(newSendCollector(apiStore)) // dbpool.go
	// Before the realtime service clears this id's index (instance.go).
	if err := m.checkInstanceID(ctx); err != nil {
		return err
	}
	m.realtime, err = gateway.NewService(gateway.Deps{
		Config: gateway.ServiceConfig{
			Hub: gateway.Config{InstanceID: cfg.InstanceID, AllowedOrigins: cfg.AllowedOrigins,
				RecoverWindow: cfg.WSRecoverWindow, RecoverMax: cfg.WSRecoverMax,
				RecoverReadRate: cfg.WSRecoverReadRate, RecoverReadBurst: cfg.WSRecoverReadBurst,
				HandshakeConcurrency: m.handshakeConcurrency(), HandshakeQueue: cfg.WSHandshakeQueue,
				HandshakeWait: cfg.WSHandshakeWait, PresenceDelay: presenceDelay(cfg.WSPresenceDelay),
				UserHandshakeRate: cfg.WSUserHandshakeRate, UserHandshakeBurst: cfg.WSUserHandshakeBurst},
			Presence: presence.Config{LivenessTTL: cfg.InstanceLivenessTTL, SweepInterval: cfg.SweepInterval, MaxConnsPerUser: cfg.WSMaxConnsPerUser, Linger: cfg.WSLinger,
				Jitter: m.presenceJitter},
			Relay:      pubsub.RelayConfig{Grace: cfg.OutboxGrace},
			PubSubMode: psMode,
			Registerer: metrics.Registry,
		},
		Logger: m.Logger, Store: apiStore, Realtime: m.rt, Verifier: verifier,
	})
	if err != nil {
		return err
	}
	m.realtime.Start()
	if err := m.startLegacyStub(metrics); err != nil {
		return err
	}
	m.api, err = restapi.NewServer(restapi.Deps{
		Config: restapi.Config{MetricsElsewhere: cfg.MetricsAddr != "", HMACSecret: []byte(cfg.HMACSecret), PublicRealtimeURL: cfg.PublicRealtimeURL, Env: cfg.Env,
			TrustedProxies: cfg.TrustedProxies, ForwardedHeader: cfg.ForwardedHeader, BodyTimeout: cfg.HTTPBodyTimeout, CORSOrigins: cfg.CORSOrigins,
			AuthFailures: restapi.AuthFailConfig{Burst: cfg.AuthFailBurst, Rate: cfg.AuthFailRate},
			Idempotency:  restapi.IdempotencyConfig{RecordTTL: cfg.IdempotencyTTL, RedisBudget: cfg.RedisTimeout, InstanceID: cfg.InstanceID, Linger: cfg.IdempotencyLinger},
			Attachments:  restapi.AttachmentConfig{MaxBytes: cfg.AttachmentMaxBytes, BlobDir: cfg.BlobDir},
			ProjectQueue: project.QueueConfig{ModuleLeaseBytes: cfg.ProjectModuleLeaseBytes, RedisBudget: cfg.RedisTimeout}},
		Logger: m.Logger, Store: apiStore, ReadyPG: m.readyPG, Redis: m.rdb, Realtime: m.rt, Verifier: verifier,
		Metrics: metrics, RateLimits: limits, Gateway: m.realtime, Publisher: m.realtime.Publisher(), LegacyStub: m.ops.stub,
	})
	if err != nil {
		return err
	}
	// Handshakes spend the REST routes' budget of refused credentials.
	m.realtime.SetCredentialGate(m.api.CredentialGate())
	m.api.MountWeb(web.Handler(cfg.PublicRealtimeURL))
	m.janitor = store.NewJanitor(store.New(m.pg), store.JanitorConfig{PendingRetention: cfg.IdempotencyTTL,
		UnsentRetention: cfg.AttachmentUnsentTTL, Blobs: m.api.Blobs()}, m.Logger)
	m.janitor.Start()
	if m.purger, err = store.NewOutboxPurger(store.New(m.pg), store.OutboxPurgerConfig{Retention: cfg.OutboxRetention,
		Registerer: metrics.Registry}, m.Logger); err != nil {
		return err
	}
	m.purger.Start()
	m.budgets = project.NewBudgetReconciler(project.NewModuleBudget(m.rdb, cfg.Env, project.ModuleBudgetBytes),
		project.BudgetReconcilerConfig{}, m.Logger)
	m.budgets.Start()

	if err := m.metrics.start(cfg.MetricsAddr, metrics.Handler(), cfg.HTTPIdleTimeout, m.Logger); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HAN_HTTP_ADDR: listen: %w", err)
	}
	m.addr = ln.Addr().String()
	capped, err := m.capListener(ctx, ln, metrics.Registry)
	if err != nil {
		_ = ln.Close()
		return err
	}
	handler := m.withDebug(m.api.Handler())
	const headerTimeout = 10 * time.Second
	// WebSocket handshakes are served by wsedge without net/http's
	// per-connection buffers; every other connection reaches net/http
	// untouched (internal/wsedge).
	edge := wsedge.New(capped, wsedge.Config{Path: restapi.RealtimePath, Handler: handler,
		HeaderTimeout: headerTimeout, Logger: m.Logger})
	m.httpSrv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       cfg.HTTPIdleTimeout,
		// Requests whose header is larger are answered 431 by net/http.
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(m.Logger.Handler(), slog.LevelWarn),
	}
	m.edge = edge
	m.stopped = make(chan struct{})
	go func() {
		m.serveErr = m.httpSrv.Serve(edge)
		close(m.stopped)
	}()
	// gomaxprocs: how many cores the Go code runs on at once (GOMAXPROCS,
	// else the CPU limit of the cgroup, else the machine's cores); see
	// docs/runbook.md on sharing a machine with PostgreSQL and Redis. gogc:
	// the collector's target (GOGC, else 100; -1 off).
	m.Logger.Info("serving", slog.String("addr", m.addr), slog.String("instance", cfg.InstanceID), slog.String("env", cfg.Env),
		slog.Int("gomaxprocs", runtime.GOMAXPROCS(0)), slog.Int("gogc", gcPercent()))
	return nil
}

// Close drains: readiness turns 503 at once while the listener keeps
// serving for HAN_DRAIN_DELAY (load balancers need a few probes to take the
// instance out), then the listener stops accepting, sockets are closed with
// 1001 and a reconnect delay, in-flight requests finish, and connections to
// Redis and PostgreSQL close. Every step after the delay spends only what
// is left of one deadline, HAN_SHUTDOWN_TIMEOUT away, so that a stalled
// Redis or PostgreSQL does not hold the process past it; a step cut short
// loses nothing durable (presence entries stay for the survivors' sweep,
// outbox rows undelivered for another instance's relay). Every step is
// logged. It is idempotent; a Close after a failed Run skips the delay.
func (m *Main) Close() error {
	if m.api != nil {
		m.api.SetDraining()
	}
	if m.httpSrv != nil {
		m.Logger.Info("drain started: /readyz answers 503, still serving", slog.Duration("delay", m.Config.DrainDelay))
		time.Sleep(m.Config.DrainDelay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.Config.ShutdownTimeout)
	defer cancel()
	// Past the deadline nothing waits on Redis any more: closing the
	// clients ends at once the commands in flight (a presence refresh, the
	// Pub/Sub link's read, a relay publish), each of which would otherwise
	// run out its own HAN_REDIS_TIMEOUT, one step after another.
	clients := []redis.UniversalClient{m.rdb, m.rt}
	closeRedis := func() {
		for _, c := range clients {
			if c != nil {
				_ = c.Close()
			}
		}
	}
	stopRedisCut := context.AfterFunc(ctx, closeRedis)
	errs := m.drain(ctx)
	if err := m.metrics.close(ctx); err != nil {
		errs = append(errs, err)
	}
	if m.realtime != nil {
		m.realtime.Shutdown(ctx)
		m.realtime = nil
	}
	if m.verifier != nil {
		// A JWKS refetch started by a request that is gone may still run;
		// it uses the Redis client closed below.
		m.verifier.Close()
		m.verifier = nil
	}
	m.closeJobs()
	if m.api != nil {
		m.api.Shutdown(ctx) // the DB0 health prober; flushes the outbox delivered marks
	}
	if err := m.closeOps(); err != nil {
		errs = append(errs, err)
	}
	pools := m.pg != nil || m.rdb != nil
	stopRedisCut()
	closeRedis() // a second Close of a client only says it is closed
	m.rdb, m.rt = nil, nil
	m.closePools(ctx)
	m.pg, m.readyPG = nil, nil
	if pools && m.Logger != nil {
		m.Logger.Info("drain: Redis and PostgreSQL connections closed")
	}
	return errors.Join(errs...)
}

// drain stops the listener, closes the sockets with 1001 and waits for the
// in-flight requests, within ctx.
func (m *Main) drain(ctx context.Context) []error {
	var errs []error
	var shutdown chan error
	if m.httpSrv != nil {
		shutdown = make(chan error, 1)
		srv := m.httpSrv
		go func() { shutdown <- srv.Shutdown(ctx) }()
		// Serve returns as soon as Shutdown has closed the listener; the
		// wait for in-flight requests goes on meanwhile.
		<-m.stopped
		if err := m.serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
		m.Logger.Info("drain: delay over, listener closed", slog.Duration("delay", m.Config.DrainDelay))
	}
	if m.realtime != nil {
		// http.Server.Shutdown does not wait for hijacked (WebSocket)
		// connections: they are closed here.
		n := m.realtime.Stats().Connections
		if err := m.realtime.Drain(ctx); err != nil {
			m.Logger.Warn("realtime drain incomplete", slog.String("kind", fmt.Sprintf("%T", errors.Unwrap(err))))
		}
		m.Logger.Info("drain: sockets closed with 1001", slog.Int("sockets", n))
	}
	if shutdown != nil {
		if err := <-shutdown; err != nil {
			errs = append(errs, err)
			m.Logger.Warn("drain: in-flight requests still running at the shutdown timeout", slog.String("kind", fmt.Sprintf("%T", err)))
		} else {
			m.Logger.Info("drain: in-flight requests finished")
		}
		m.httpSrv = nil
	}
	return errs
}

// poolCloseWait bounds the wait for the PostgreSQL pools to close at the
// end of the drain, and so does what is left of the drain's deadline.
const poolCloseWait = 2 * time.Second

// closePools closes the PostgreSQL pools together and waits for them at
// most poolCloseWait, and not past ctx's deadline. A connection a deadline
// broke is closed by pgx in the background, with a cancel request to the
// server and up to 15 s for its answer, and closing a pool waits for that:
// against a server that stalls (a partition, a stopped process) the drain
// would run 15 s past its bound and the supervisor kill the process.
// Nothing is left to write by then, and the process's exit closes the
// sockets.
func (m *Main) closePools(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range []*pgxpool.Pool{m.readyPG, m.pg} {
		if p != nil {
			wg.Go(p.Close)
		}
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	wctx, cancel := context.WithTimeout(ctx, poolCloseWait)
	defer cancel()
	select {
	case <-done:
	case <-wctx.Done():
		if m.Logger != nil {
			m.Logger.Warn("drain: PostgreSQL connections not closed within the wait; leaving them to the exit",
				slog.Duration("wait", poolCloseWait))
		}
	}
}

// closeJobs stops the background jobs that run on their own timers (the
// janitor, the outbox purge, the budget reconciler) and waits for a run in
// progress.
func (m *Main) closeJobs() {
	if m.janitor != nil {
		m.janitor.Close()
		m.janitor = nil
	}
	if m.purger != nil {
		m.purger.Close()
		m.purger = nil
	}
	if m.budgets != nil {
		m.budgets.Close()
		m.budgets = nil
	}
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// migrateDirect applies the migrations over HAN_DATABASE_DIRECT_URL, on a
// connection of its own closed afterwards: migrations take the migration
// lock and run DDL, which belong on a connection straight to PostgreSQL,
// not one shared through a transaction-pooling proxy. name is the variable
// that holds url; a failure names it and the error's kind, never the
// error's text, which quotes the URL's user, host and database.
func migrateDirect(ctx context.Context, url, name string, logger *slog.Logger) error {
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 1, MinConns: 1, URLName: name})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err) // OpenPG's errors quote nothing of the URL
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := store.MigrateLogged(mctx, pool, logger); err != nil {
		return dbURLError(name, "migrations not applied", err)
	}
	return nil
}

// presenceDelay maps HAN_WS_PRESENCE_DELAY onto the hub's setting, where
// zero means the default: 0 (at once) becomes negative.
func presenceDelay(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
