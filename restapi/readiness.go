package restapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/store"
)

// readyReuse is how long a dependency's check answers the readiness probes
// that follow it, counted from the check's start. /readyz is public: a
// flood of probes costs each dependency at most one check per readyReuse,
// and an outage still shows within readyReuse + ReadyTimeout.
const readyReuse = time.Second

// readyChecks are the dependency checks of /readyz; nil: the dependency is
// not configured.
type readyChecks struct {
	postgres, redis, redisRealtime *readyCheck
}

// initReadiness sets up the checks and exports the PostgreSQL one as
// han_postgres_up, so an outage shows in metrics whatever the traffic (with
// no request arriving, no request fails). A scrape takes the check's
// shared result like a probe does: it adds no ping beyond one a second on
// the readiness connection, never queues the load balancer's probe behind
// its own, and waits at most ReadyTimeout for a stalled PostgreSQL.
func (s *Server) initReadiness() error {
	s.ready.postgres = newReadyCheck(s.cfg.ReadyTimeout, s.readyPG.Ping)
	if s.rdb != nil {
		s.ready.redis = newReadyCheck(s.cfg.ReadyTimeout, func(ctx context.Context) error { return s.rdb.Ping(ctx).Err() })
	}
	if s.rt != nil {
		s.ready.redisRealtime = newReadyCheck(s.cfg.ReadyTimeout, func(ctx context.Context) error { return s.rt.Ping(ctx).Err() })
	}
	return s.metrics.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "han_postgres_up",
		Help: "1 when PostgreSQL answered the readiness check's ping (its own connection, shared with /readyz) at scrape time."},
		func() float64 {
			if s.ready.postgres.up(context.Background()) {
				return 1
			}
			return 0
		}))
}

// readyCheck is one dependency's check, shared by every readiness probe:
// a probe that comes while a check runs waits for that check, and one that
// comes within readyReuse of its start takes its result. So a flood of
// probes never queues on the readiness connection (a single one for
// PostgreSQL), where the load balancer's own probe would time out behind
// them and read a healthy PostgreSQL as down.
type readyCheck struct {
	ping    func(ctx context.Context) error
	timeout time.Duration

	mu   sync.Mutex  // guards last
	last *readyRound // nil before the first check
}

// readyRound is one run of a check.
type readyRound struct {
	started time.Time
	done    chan struct{} // closed when the check has ended
	up      bool          // set before done is closed
}

func newReadyCheck(timeout time.Duration, ping func(ctx context.Context) error) *readyCheck {
	return &readyCheck{ping: ping, timeout: timeout}
}

// up reports whether the dependency answered its check: the running one,
// the latest if it started less than readyReuse ago, else a new one run
// here. The check runs under its own timeout, unaffected by a caller that
// goes away, because others may be waiting for it.
func (c *readyCheck) up(ctx context.Context) bool {
	c.mu.Lock()
	if f := c.last; f != nil && (!f.ended() || time.Since(f.started) < readyReuse) {
		c.mu.Unlock()
		<-f.done
		return f.up
	}
	f := &readyRound{started: time.Now(), done: make(chan struct{})}
	c.last = f
	c.mu.Unlock()
	defer close(f.done)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	f.up = c.ping(ctx) == nil
	return f.up
}

func (f *readyRound) ended() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

type readyDTO struct {
	Status       string            `json:"status"`
	Checks       map[string]string `json:"checks"`
	PostgresPool *poolDTO          `json:"postgresPool,omitempty"`
}

// poolDTO is the request pool's load at the moment of the probe.
type poolDTO struct {
	Max      int32 `json:"max"`
	Total    int32 `json:"total"`
	Acquired int32 `json:"acquired"`
	Idle     int32 `json:"idle"`
	// Saturated: every connection is in use, so new requests wait for one
	// (up to the request budget, then 503 database_busy).
	Saturated bool `json:"saturated"`
}

func poolStat(l store.PoolLoad) *poolDTO {
	return &poolDTO{Max: l.Max, Total: l.Total, Acquired: l.Acquired, Idle: l.Idle, Saturated: l.Acquired >= l.Max}
}

// readyz: PostgreSQL down or draining → 503; a Redis outage → 200
// "degraded", because pulling every instance for a shared Redis outage
// would turn a partial failure into a full one (docs/degraded-mode.md).
// PostgreSQL is pinged over the probe's own connection: a busy request pool
// is not an outage (every instance would be pulled at once under a burst),
// so it is reported in checks.postgresPool and postgresPool, never as 503.
// The pings are shared between concurrent probes (readyCheck); draining,
// the Pub/Sub link and the pool load are read fresh for each probe.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	check := func(name string, c *readyCheck) {
		if c == nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := "ok"
			if !c.up(r.Context()) {
				st = "down"
			}
			mu.Lock()
			checks[name] = st
			mu.Unlock()
		}()
	}
	check("postgres", s.ready.postgres)
	check("redis", s.ready.redis)
	check("redisRealtime", s.ready.redisRealtime)
	wg.Wait()
	if s.gw != nil && !s.gw.PubSubHealthy() {
		checks["pubsub"] = "down"
	} else if s.gw != nil {
		checks["pubsub"] = "ok"
	}
	dto := readyDTO{Status: "ok", Checks: checks, PostgresPool: poolStat(s.store.PoolLoad())}
	checks["postgresPool"] = "ok"
	if dto.PostgresPool.Saturated {
		checks["postgresPool"] = "saturated"
	}
	status := http.StatusOK
	switch {
	case s.draining.Load():
		dto.Status, status = "draining", http.StatusServiceUnavailable
	case checks["postgres"] != "ok":
		dto.Status, status = "unavailable", http.StatusServiceUnavailable
	case checks["redis"] == "down" || checks["redisRealtime"] == "down" || checks["pubsub"] == "down":
		dto.Status = "degraded"
	}
	writeJSON(w, status, dto)
}
