package store

import (
	"context"
	"log/slog"
	"time"

	"github.com/han-app/gateway/internal/loop"
)

// JanitorConfig tunes the Janitor.
type JanitorConfig struct {
	// Interval between runs. Zero value means 5m.
	Interval time.Duration
	// Batch is the most rows one DELETE removes. Zero value means 1000.
	Batch int
	// PendingRetention is how long a never-uploaded attachment is kept after
	// its upload URL expired, so an idempotent replay of its init still finds
	// it. Zero value means 24h (the default idempotency record TTL).
	PendingRetention time.Duration
	// UnsentRetention is how long an uploaded attachment that no message
	// links is kept after its upload, for the send that should link it.
	// Zero value means 24h.
	UnsentRetention time.Duration
	// Blobs is the blob store the unsent attachments' bytes are deleted
	// from. Nil means unsent attachments are kept: deleting their rows
	// without their blobs would leave files nothing refers to.
	Blobs BlobStore
}

// Janitor purges expired idempotency records, abandoned pending
// attachments and unsent uploaded ones (with their blobs) in batches, on a
// timer. Start launches its goroutine, Close stops it and waits; both are
// safe to call once each from any goroutine, and Close is idempotent.
type Janitor struct {
	store  *Store
	cfg    JanitorConfig
	logger *slog.Logger
	loop   *loop.Loop
}

// NewJanitor builds a stopped janitor.
func NewJanitor(s *Store, cfg JanitorConfig, logger *slog.Logger) *Janitor {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Minute
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 1000
	}
	if cfg.PendingRetention <= 0 {
		cfg.PendingRetention = 24 * time.Hour
	}
	if cfg.UnsentRetention <= 0 {
		cfg.UnsentRetention = 24 * time.Hour
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	j := &Janitor{store: s, cfg: cfg, logger: logger}
	j.loop = loop.New(loop.Config{Interval: cfg.Interval, Immediate: true}, func(ctx context.Context) bool {
		_, _ = j.RunOnce(ctx)
		return true
	})
	return j
}

// Start runs the janitor until Close: once right away, then every Interval.
func (j *Janitor) Start() { j.loop.Start() }

// RunOnce purges once and returns how many rows it removed.
func (j *Janitor) RunOnce(ctx context.Context) (int64, error) {
	n, err := j.store.PurgeExpiredIdempotency(ctx, j.cfg.Batch)
	if err != nil {
		j.logger.Warn("janitor: purge idempotency records failed", slog.String("kind", Kind(err)))
		return n, err
	}
	m, err := j.store.PurgeAbandonedAttachments(ctx, j.cfg.PendingRetention, j.cfg.Batch)
	if err != nil {
		j.logger.Warn("janitor: purge pending attachments failed", slog.String("kind", Kind(err)))
		return n + m, err
	}
	var u int64
	if j.cfg.Blobs != nil {
		u, err = j.store.PurgeUnsentAttachments(ctx, j.cfg.Blobs, j.cfg.UnsentRetention, j.cfg.Batch)
		if err != nil {
			j.logger.Warn("janitor: purge unsent attachments failed", slog.String("kind", Kind(err)))
		}
	}
	if n+m+u > 0 {
		j.logger.Info("janitor: purged", slog.Int64("idempotency_records", n), slog.Int64("attachments", m),
			slog.Int64("unsent_attachments", u))
	}
	return n + m + u, err
}

// Close stops the janitor and waits for a run in progress to end. A janitor
// never started closes at once.
func (j *Janitor) Close() { j.loop.Close() }
