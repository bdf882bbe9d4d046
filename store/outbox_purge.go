package store

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/loop"
)

// OutboxPurgerConfig tunes an OutboxPurger.
type OutboxPurgerConfig struct {
	// Retention is how long a delivered row is kept after its delivery
	// (HAN_OUTBOX_RETENTION): readers of recent events rely on every
	// delivered row of that window being there. Zero value means 15m.
	Retention time.Duration
	// Interval between runs. Zero value means 1m.
	Interval time.Duration
	// Batch is the most rows one DELETE removes. Zero value means 5000.
	Batch int
	// Budget: a run starts no further DELETE once it has run this long,
	// and each of its statements gets at most this long to answer. A run
	// therefore ends within three budgets (DELETEs started within one,
	// the last one's answer, the count of old undelivered rows), also on
	// a connection that went silent. Zero value means 30s.
	Budget time.Duration
	// Registerer receives the purger's metrics; nil means none.
	Registerer prometheus.Registerer
}

// OutboxPurger deletes delivered outbox rows once they are older than the
// retention, in batches, on a timer. It never deletes an undelivered row:
// those belong to the relay however old they are, and the purger only
// counts the ones past the retention (a gauge and a warning). Start launches
// its goroutine, Close stops it and waits; Close is idempotent.
type OutboxPurger struct {
	store  *Store
	cfg    OutboxPurgerConfig
	logger *slog.Logger
	loop   *loop.Loop

	purged prometheus.Counter
	stale  prometheus.Gauge
}

// NewOutboxPurger builds a stopped purger.
func NewOutboxPurger(s *Store, cfg OutboxPurgerConfig, logger *slog.Logger) (*OutboxPurger, error) {
	if cfg.Retention <= 0 {
		cfg.Retention = 15 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 5000
	}
	if cfg.Budget <= 0 {
		cfg.Budget = 30 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &OutboxPurger{store: s, cfg: cfg, logger: logger,
		purged: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_outbox_purged_total",
			Help: "Delivered outbox rows deleted after HAN_OUTBOX_RETENTION."}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{Name: "han_outbox_undelivered_past_retention",
			Help: "Undelivered outbox rows older than HAN_OUTBOX_RETENTION at the last purge run (left to the relay)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{p.purged, p.stale} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	p.loop = loop.New(loop.Config{Interval: cfg.Interval, Immediate: true, Timeout: 3 * cfg.Budget}, func(ctx context.Context) bool {
		_, _ = p.RunOnce(ctx)
		return true
	})
	return p, nil
}

// Start runs the purger until Close: once right away, then every Interval.
func (p *OutboxPurger) Start() { p.loop.Start() }

// Close stops the purger and waits for a run in progress to end. A purger
// never started closes at once.
func (p *OutboxPurger) Close() { p.loop.Close() }

// RunOnce deletes delivered rows past the retention, batch by batch, until
// a batch comes back short or the budget is used, then counts the
// undelivered rows past the retention. It returns how many rows it deleted.
// Each statement gets at most one Budget: one whose connection went silent
// (its request lost on the way, nothing reset) is cut, its connection is
// dropped, and the run ends with the error; the next run goes on with a
// new connection.
func (p *OutboxPurger) RunOnce(ctx context.Context) (int64, error) {
	deadline := time.Now().Add(p.cfg.Budget)
	var total int64
	var err error
	for {
		var n int64
		sctx, cancel := context.WithTimeout(ctx, p.cfg.Budget)
		n, err = p.store.PurgeDeliveredOutbox(sctx, p.cfg.Retention, p.cfg.Batch)
		cancel()
		total += n
		p.purged.Add(float64(n))
		if err != nil || n < int64(p.cfg.Batch) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		p.logger.Warn("outbox purge failed", slog.String("kind", Kind(err)), slog.Int64("purged", total))
		return total, err
	}
	sctx, cancel := context.WithTimeout(ctx, p.cfg.Budget)
	stale, err := p.store.UndeliveredOutboxOlderThan(sctx, p.cfg.Retention)
	cancel()
	if err != nil {
		p.logger.Warn("outbox purge: counting old undelivered rows failed", slog.String("kind", Kind(err)))
		return total, err
	}
	p.stale.Set(float64(stale))
	if stale > 0 {
		p.logger.Warn("outbox rows older than the retention are still undelivered; left to the relay",
			slog.Int64("rows", stale), slog.Duration("retention", p.cfg.Retention))
	}
	if total > 0 {
		p.logger.Info("outbox purge", slog.Int64("purged", total))
	}
	return total, nil
}

// purgeOutboxSQL deletes one batch ($2) of rows delivered more than $1
// seconds ago: the oldest deliveries through outbox_delivered_idx, then the
// rows by primary key.
const purgeOutboxSQL = `DELETE FROM outbox WHERE id = ANY(ARRAY(
	SELECT id FROM outbox
	WHERE delivered_at IS NOT NULL AND delivered_at < now() - make_interval(secs => $1)
	ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED))`

// PurgeDeliveredOutbox deletes at most batch outbox rows delivered more than
// retention ago, oldest delivery first, and returns how many it deleted. A
// row is delivered after it was created, so no row younger than the
// retention is ever deleted, and an undelivered row never is. The rows are
// found through outbox_delivered_idx (a partial index on delivered_at of
// delivered rows), so a batch reads only rows it deletes; rows another
// instance is deleting at the same time are skipped, not waited for.
func (s *Store) PurgeDeliveredOutbox(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	tag, err := s.pool.Exec(ctx, purgeOutboxSQL, retention.Seconds(), batch)
	if err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}

// UndeliveredOutboxOlderThan counts undelivered rows created more than age
// ago (through the partial index of undelivered rows).
func (s *Store) UndeliveredOutboxOlderThan(ctx context.Context, age time.Duration) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox
		WHERE delivered_at IS NULL AND created_at < now() - make_interval(secs => $1)`, age.Seconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count old undelivered outbox rows: %w", err)
	}
	return n, nil
}
