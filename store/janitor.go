package store

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/han-app/gateway/internal/loop"
)

// JanitorConfig tunes the Janitor.
type JanitorConfig struct {
	// Interval between runs. Zero value means 5m. A run started by Start
	// gets at most one Interval, and at most janitorMaxRun.
	Interval time.Duration
	// Batch is the most rows one DELETE removes. Zero value means 1000.
	Batch int
	// PendingRetention is how long an attachment that no message links is
	// kept after its upload URL expired, so an idempotent replay of its init
	// still finds it: the idempotency record TTL. A never-uploaded one is
	// deleted then, an uploaded one once UnsentRetention has passed too.
	// Zero value means 24h (the default idempotency record TTL).
	PendingRetention time.Duration
	// UnsentRetention is how long an uploaded attachment that no message
	// links is kept after its upload, for the send that should link it
	// (and at least PendingRetention after its upload URL expired). Zero
	// value means 24h.
	UnsentRetention time.Duration
	// Blobs is the blob store the unsent attachments' bytes are deleted
	// from. Nil means unsent attachments are kept: deleting their rows
	// without their blobs would leave files nothing refers to.
	Blobs BlobStore
	// OrphanAge is how long ago a blob must have been last written for the
	// orphan sweep to delete it when no attachment row names it. Zero
	// value means DefaultOrphanBlobAge (1h); it must stay far above the
	// request budget, the longest a blob waits for its row's commit.
	OrphanAge time.Duration
	// OrphanScan is the most blob files one run examines for the orphan
	// sweep (one query per Batch of them); the next run resumes where it
	// stopped. Zero value means 10 batches. The sweep runs when Blobs can
	// list its blobs (BlobLister).
	OrphanScan int
}

// Janitor purges expired idempotency records, abandoned pending
// attachments and unsent uploaded ones (with their blobs) in batches, and
// sweeps the blob store for orphan blobs, on a timer. Start launches its
// goroutine, Close stops it and waits; both are safe to call once each
// from any goroutine, and Close is idempotent.
type Janitor struct {
	store  *Store
	cfg    JanitorConfig
	logger *slog.Logger
	loop   *loop.Loop

	mu     sync.Mutex // serialises orphan sweeps and guards cursor
	cursor string     // the blob key the next orphan sweep resumes after
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
	if cfg.OrphanAge <= 0 {
		cfg.OrphanAge = DefaultOrphanBlobAge
	}
	if cfg.OrphanScan <= 0 {
		cfg.OrphanScan = 10 * cfg.Batch
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	j := &Janitor{store: s, cfg: cfg, logger: logger}
	j.loop = loop.New(loop.Config{Interval: cfg.Interval, Immediate: true, Timeout: min(cfg.Interval, janitorMaxRun)}, func(ctx context.Context) bool {
		_, _ = j.RunOnce(ctx)
		return true
	})
	return j
}

// janitorMaxRun is the longest run of a started janitor (its deletes, its
// orphan sweep and their queries). A run not finished by then, such as one
// waiting on a connection that went silent (its request lost on the way,
// nothing reset), is cut: the connection is dropped, and the next run
// resumes, since every step deletes in batches and the orphan sweep goes
// on from where it stopped. A run is cut at its Interval when that is
// shorter: a longer run would only hold back the next one.
const janitorMaxRun = time.Minute

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
		u, err = j.store.PurgeUnsentAttachments(ctx, j.cfg.Blobs, j.cfg.UnsentRetention, j.cfg.PendingRetention, j.cfg.Batch)
		if err != nil {
			j.logger.Warn("janitor: purge unsent attachments failed", slog.String("kind", Kind(err)))
		}
	}
	orphans, serr := j.SweepOrphanBlobs(ctx)
	if err == nil {
		err = serr
	}
	if n+m+u > 0 || orphans > 0 {
		j.logger.Info("janitor: purged", slog.Int64("idempotency_records", n), slog.Int64("attachments", m),
			slog.Int64("unsent_attachments", u), slog.Int("orphan_blobs", orphans))
	}
	return n + m + u, err
}

// SweepOrphanBlobs deletes blobs no attachment row names that were last
// written more than OrphanAge ago: those of rows purged while the blob's
// delete failed, and those written by uploads whose row never came (a
// crash, a write that failed after the blob was stored, or one whose
// outcome was unknown and that did not land). It examines at most
// OrphanScan files, Batch at a time, resuming after the last one the
// previous run examined and starting over once the listing ends. It
// returns how many blobs it deleted; it does nothing when Blobs cannot
// list its blobs.
func (j *Janitor) SweepOrphanBlobs(ctx context.Context) (int, error) {
	lister, ok := j.cfg.Blobs.(BlobLister)
	if !ok {
		return 0, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	cutoff := time.Now().Add(-j.cfg.OrphanAge)
	deleted := 0
	for left := j.cfg.OrphanScan; left > 0; left -= j.cfg.Batch {
		n, next, err := j.store.SweepOrphanBlobs(ctx, lister, j.cursor, cutoff, min(left, j.cfg.Batch))
		deleted += n
		j.cursor = next
		if err != nil {
			j.logger.Warn("janitor: sweep orphan blobs failed", slog.String("kind", Kind(err)))
			return deleted, err
		}
		if next == "" {
			break
		}
	}
	return deleted, nil
}

// Close stops the janitor and waits for a run in progress to end. A janitor
// never started closes at once.
func (j *Janitor) Close() { j.loop.Close() }
