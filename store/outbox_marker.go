package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MarkFlushInterval is the longest a published event id waits in an
// OutboxMarker before its row is marked delivered (the default of
// OutboxMarkerConfig.Interval). The relay republishes rows still undelivered
// after HAN_OUTBOX_GRACE, so the interval plus one UPDATE must stay far below
// the grace: internal/config refuses a grace under 1s (twenty intervals).
const MarkFlushInterval = 50 * time.Millisecond

// OutboxMarkerConfig tunes an OutboxMarker.
type OutboxMarkerConfig struct {
	// Interval is the longest an id waits for its flush. Zero value means
	// MarkFlushInterval.
	Interval time.Duration
	// Batch: a flush starts as soon as this many ids are queued, and one
	// UPDATE marks at most this many. Zero value means 256.
	Batch int
	// Queue bounds the ids waiting; a Mark beyond it is dropped (the relay
	// republishes that row after the grace). Zero value means 16 × Batch.
	Queue int
	// Timeout bounds one UPDATE. Zero value means 2s.
	Timeout time.Duration
	// Registerer receives the marker's metrics; nil means none.
	Registerer prometheus.Registerer
}

// OutboxMarker records that the request path published outbox events: it
// queues their event ids and marks the rows delivered with one
// UPDATE … WHERE event_id = ANY($1) per flush, instead of one UPDATE and
// commit per message. A flush runs as soon as Batch ids are queued, else
// Interval after the marker woke up or after its previous flush, so no id
// waits longer than Interval plus a flush in progress. A mark that is lost
// (queue full, flush failed, instance crashed) only means the relay
// publishes the row once more after HAN_OUTBOX_GRACE: delivery is at least
// once and clients drop a duplicate by its event id.
//
// Its goroutine runs only while ids are queued, so an idle marker holds
// none. Shutdown (or Close) flushes what is queued and waits; marks after
// it are dropped. Safe for concurrent use.
type OutboxMarker struct {
	store  *Store
	cfg    OutboxMarkerConfig
	logger *slog.Logger

	marked  prometheus.Counter
	dropped *prometheus.CounterVec

	mu      sync.Mutex // guards queue, running, closed
	queue   []string
	running bool
	closed  bool
	kick    chan struct{} // a full batch is queued (capacity 1)
	stop    chan struct{} // closed by Close
	wg      sync.WaitGroup
	// life bounds every flush besides its Timeout; Shutdown cancels it
	// when its context ends, cutting a flush already under way.
	life    context.Context
	endLife context.CancelFunc
}

// NewOutboxMarker builds an idle marker writing through s.
func NewOutboxMarker(s *Store, cfg OutboxMarkerConfig, logger *slog.Logger) (*OutboxMarker, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = MarkFlushInterval
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 256
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 16 * cfg.Batch
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	life, endLife := context.WithCancel(context.Background())
	m := &OutboxMarker{store: s, cfg: cfg, logger: logger, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		life: life, endLife: endLife,
		marked: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_outbox_marks_total",
			Help: "Outbox rows the request path published and the batched marker updated (one UPDATE per batch)."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "han_outbox_marks_dropped_total",
			Help: "Delivered marks lost (the relay publishes those rows again after the grace), by reason: queue_full, flush_failed, closed."},
			[]string{"reason"}),
	}
	if cfg.Registerer != nil {
		var err error
		if m.marked, err = registerOrReuse(cfg.Registerer, m.marked); err != nil {
			return nil, err
		}
		if m.dropped, err = registerOrReuse(cfg.Registerer, m.dropped); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"queue_full", "flush_failed", "closed"} {
		m.dropped.WithLabelValues(r)
	}
	return m, nil
}

// registerOrReuse registers c, or returns the collector of the same type
// already registered under its name (several markers on one registry, as
// several API servers sharing one set of metrics have).
func registerOrReuse[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
}

// Mark queues the event id of a published outbox row. It never blocks on
// PostgreSQL: with the queue full the mark is dropped and counted.
func (m *OutboxMarker) Mark(eventID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		m.dropped.WithLabelValues("closed").Inc()
		return
	case len(m.queue) >= m.cfg.Queue:
		m.dropped.WithLabelValues("queue_full").Inc()
		return
	}
	m.queue = append(m.queue, eventID)
	if len(m.queue) >= m.cfg.Batch {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	if !m.running {
		m.running = true
		m.wg.Add(1)
		go m.run()
	}
}

// run flushes while ids are queued and ends once the queue is empty.
func (m *OutboxMarker) run() {
	defer m.wg.Done()
	t := time.NewTimer(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return // Close flushes the rest
		case <-m.kick:
		case <-t.C:
		}
		select {
		case <-m.stop:
			// A kick or the timer may be ready beside the stop, and select
			// picks among them at random: Close's single budget must not
			// wait for one more flush here.
			return
		default:
		}
		m.flush(m.take())
		m.mu.Lock()
		left := len(m.queue)
		if left == 0 {
			m.running = false
		}
		m.mu.Unlock()
		if left == 0 {
			return
		}
		t.Reset(m.cfg.Interval)
		if left >= m.cfg.Batch {
			select {
			case m.kick <- struct{}{}:
			default:
			}
		}
	}
}

// take removes up to Batch ids from the head of the queue.
func (m *OutboxMarker) take() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := min(len(m.queue), m.cfg.Batch)
	batch := slices.Clone(m.queue[:n])
	m.queue = slices.Delete(m.queue, 0, n)
	if len(m.queue) == 0 && cap(m.queue) > 4*m.cfg.Batch {
		m.queue = nil // give back the memory of a burst
	}
	return batch
}

// flush marks one batch delivered within its own Timeout and counts the
// outcome.
func (m *OutboxMarker) flush(batch []string) {
	ctx, cancel := context.WithTimeout(m.life, m.cfg.Timeout)
	defer cancel()
	m.flushWithin(ctx, batch)
}

// flushWithin marks one batch delivered within ctx and counts the outcome;
// false when the batch was not marked.
func (m *OutboxMarker) flushWithin(ctx context.Context, batch []string) bool {
	if len(batch) == 0 {
		return true
	}
	n, err := m.store.MarkOutboxDeliveredBatch(ctx, batch)
	if err != nil {
		m.dropped.WithLabelValues("flush_failed").Add(float64(len(batch)))
		m.logger.Warn("outbox marker: flush failed; the relay publishes these rows again",
			slog.Int("events", len(batch)), slog.String("kind", Kind(err)))
		return false
	}
	m.marked.Add(float64(n))
	return true
}

// Close is Shutdown with no deadline but the flushes' own Timeout.
func (m *OutboxMarker) Close() { m.Shutdown(context.Background()) }

// Shutdown stops taking marks, flushes the ids still queued and waits,
// within ctx: the instance's shutdown has one deadline, and a stalled
// PostgreSQL must not hold it past that. A flush under way when ctx ends
// is cut, and the flushes of what is queued share one Timeout, itself cut
// at ctx's end: with the queue full, a Timeout per batch would hold the
// shutdown for 16 of them. A failed flush or the end of the budget drops
// what is left (counted as closed); those rows stay undelivered, and the
// relay of this or another instance publishes them again after the grace.
// It is idempotent.
func (m *OutboxMarker) Shutdown(ctx context.Context) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return
	}
	m.closed = true
	close(m.stop)
	m.mu.Unlock()
	stopCut := context.AfterFunc(ctx, m.endLife)
	defer func() {
		stopCut()
		m.endLife()
	}()
	m.wg.Wait()
	fctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	for {
		batch := m.take()
		if len(batch) == 0 {
			return
		}
		tried := fctx.Err() == nil
		if tried && m.flushWithin(fctx, batch) {
			continue
		}
		dropped := 0
		if !tried {
			dropped = len(batch) // a failed flush counted its own
		}
		for rest := m.take(); len(rest) > 0; rest = m.take() {
			dropped += len(rest)
		}
		m.dropped.WithLabelValues("closed").Add(float64(dropped))
		return
	}
}

// MarkOutboxDeliveredBatch records that the request path published the
// events with these ids, in one statement, and returns how many rows it
// found. A row the relay delivered first keeps its delivered_at and its
// attempts. The statement filters on event_id alone so that PostgreSQL
// finds the rows through the event_id index, one probe per id: a filter on
// delivered_at IS NULL would let the planner walk the partial index of
// undelivered rows instead, a cost that grows with the relay's backlog. The
// ids are sorted so that concurrent batches lock rows in the same order.
func (s *Store) MarkOutboxDeliveredBatch(ctx context.Context, eventIDs []string) (int64, error) {
	ids := slices.Clone(eventIDs)
	slices.Sort(ids)
	tag, err := s.pool.Exec(ctx, markOutboxSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("mark outbox delivered: %w", err)
	}
	return tag.RowsAffected(), nil
}

// markOutboxSQL marks the rows of the event ids in $1 delivered.
const markOutboxSQL = `UPDATE outbox SET delivered_at = coalesce(delivered_at, now()),
	attempts = attempts + CASE WHEN delivered_at IS NULL THEN 1 ELSE 0 END
	WHERE event_id = ANY($1::text[]::uuid[])`
