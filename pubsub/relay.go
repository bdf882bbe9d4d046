package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store/rds"
)

// OutboxRow is an undelivered outbox event claimed by the relay.
type OutboxRow struct {
	ID       int64
	EventID  string
	Channel  string
	EntityID string
	Payload  []byte
	Attempts int
}

// Outbox is the durable store of events the relay drains; the PostgreSQL
// store implements it. Defined here so that the relay links no database
// driver.
type Outbox interface {
	// RelayOutbox claims up to limit undelivered rows older than grace so
	// that no other relay takes them meanwhile, calls publish for each in
	// id order and marks the rows publish succeeded on as delivered. A
	// publish error wrapping rds.ErrLockHeld or ErrRowDeferred skips that
	// row (another deliverer holds it; its Redis node failed: the row is
	// not to blame). One wrapping ErrRowRefusedAlone skips it too and
	// counts an attempt on it (the server of its slot takes publishes and
	// the row is what it refuses); a row whose frame cannot be built
	// counts one without a publish. A row at OutboxMaxAttempts is given
	// up: never claimed again. Any other error ends the batch.
	RelayOutbox(ctx context.Context, grace time.Duration, limit int,
		publish func(ctx context.Context, row OutboxRow) error) (OutboxRun, error)
}

// OutboxRun is what one RelayOutbox batch did.
type OutboxRun struct {
	Claimed, Delivered int
	// GivenUp holds the event ids of the rows this batch gave up on.
	GivenUp []string
}

// OutboxMaxAttempts is how many times a row may be refused by Redis (or
// fail to give a frame) before the relay gives it up: one row Redis will
// never take must not hold back the rows after it forever. A given-up row
// stays undelivered in the table (han_outbox_undelivered_past_retention
// counts it once it is older than the retention).
const OutboxMaxAttempts = 10

// ErrRowRefused marks a publish that Redis answered with an error reply:
// the server works and refused this row (a channel its ACL does not
// allow, say), unlike a timeout or a lost connection. The relay returns it
// only together with ErrRowRefusedAlone.
var ErrRowRefused = errors.New("pubsub: redis refused the row's publish")

// ErrRowRefusedAlone marks, beside ErrRowRefused, a refusal of this row
// alone: a publish to the relay's probe channel of the row's hash slot
// went through right after it, so the server that refused the row takes
// publishes and the row is what it refuses. Such a row is charged an
// attempt even when no other row of its batch was published (a batch made
// only of refused rows would otherwise be claimed again and again,
// holding back every row behind it). When the probe is refused too, the
// publish error is returned as it is: that server refuses publishes, as
// one that does not answer, and the row is not to blame.
var ErrRowRefusedAlone = errors.New("pubsub: redis refused the row's publish and took another")

// ErrRowDeferred marks a row left for a later run without a charge: the
// Redis node its publish goes to did not take it (no answer, or it
// refuses every publish: the probe was refused too), or failed earlier in
// the same batch. The row is not to blame, and the batch goes on: the
// other nodes of a Redis Cluster may take their rows.
var ErrRowDeferred = errors.New("pubsub: the row's redis node failed; left for a later run")

// relayProbePrefix starts the channels the relay publishes to after a
// refusal, to tell a refused row from refused publishes: channels of the
// service's own prefix that nobody subscribes to.
const relayProbePrefix = "han:rt:relay-probe:"

// RelayConfig tunes the outbox relay.
type RelayConfig struct {
	// Grace: rows younger than this belong to the request path, which
	// publishes right after its commit. Zero value means 5s.
	Grace time.Duration
	// Interval between relay runs while nothing is pending. Zero value
	// means 1s (jittered ±20%).
	Interval time.Duration
	// Batch is the most rows one run claims. Zero value means 100.
	Batch int
	// PublishTimeout bounds one PUBLISH. Zero value means 1s.
	PublishTimeout time.Duration
	// MaxBackoff caps the backoff after failing runs. Zero value means 30s.
	MaxBackoff time.Duration
	// Registerer receives the relay's metrics; nil means none.
	Registerer prometheus.Registerer
	// Mode is the subscribers' Pub/Sub mode, which the relay publishes
	// for. Zero value means rds.PubSubAuto.
	Mode rds.PubSubMode
}

func (c *RelayConfig) defaults() {
	if c.Grace <= 0 {
		c.Grace = 5 * time.Second
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
}

// Relay publishes outbox rows the request path could not (a crash between
// commit and publish, a Redis outage). Every instance runs one: rows are
// claimed with FOR UPDATE SKIP LOCKED, so two relays never hold the same
// row, and each publish runs under han:coord:lock:delivery:{<message_id>}
// (the Redis lock is an optimisation next to the row lock). A Redis node
// that fails a row leaves only the rows it serves for a later run
// (relayBatch). A row may be published twice (published, then the commit
// failed); both copies carry the same event id, which clients dedupe on.
// Safe for concurrent use.
type Relay struct {
	cfg    RelayConfig
	outbox Outbox
	rdb    redis.UniversalClient
	locker *rds.Locker
	logger *slog.Logger

	published prometheus.Counter
	failures  prometheus.Counter

	mu      sync.Mutex // guards cancel, started
	cancel  context.CancelFunc
	started bool
	wg      sync.WaitGroup
	// bound ends the marks of a run that outlive its cancellation
	// (MarksContext); Shutdown ends it when its context ends.
	bound    context.Context
	endBound context.CancelFunc
}

// NewRelay returns a relay publishing on the DB1 client.
func NewRelay(ob Outbox, rdb redis.UniversalClient, cfg RelayConfig, logger *slog.Logger) (*Relay, error) {
	if ob == nil || rdb == nil || logger == nil {
		return nil, errors.New("pubsub: relay needs a store, a Redis client and a logger")
	}
	cfg.defaults()
	bound, endBound := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, outbox: ob, rdb: rdb, locker: rds.NewLocker(rdb), logger: logger, bound: bound, endBound: endBound,
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_outbox_relay_published_total",
			Help: "Outbox events published by the relay (not by the request path)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_outbox_relay_failures_total",
			Help: "Relay runs that failed (Redis or PostgreSQL unavailable)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.published, r.failures} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// RunOnce claims one batch and publishes it. It returns how many rows it
// claimed and published.
func (r *Relay) RunOnce(ctx context.Context) (claimed, published int, err error) {
	b := &relayBatch{r: r, down: map[string]bool{}}
	run, err := r.outbox.RelayOutbox(ctx, r.cfg.Grace, r.cfg.Batch, b.publish)
	claimed, published = run.Claimed, run.Delivered
	for _, id := range run.GivenUp {
		r.logger.Error("outbox relay gave up a row: redis refused it every time", slog.String("event_id", id),
			slog.Int("attempts", OutboxMaxAttempts))
	}
	r.published.Add(float64(published))
	if err == nil && b.failed != nil {
		// A node did not take publishes: the run failed, though the rows
		// of the other nodes went out.
		err = fmt.Errorf("relay publish: %w", b.failed)
	}
	if err != nil {
		r.failures.Inc()
	}
	return claimed, published, err
}

// relayBatch is one RunOnce: the Redis nodes that failed it so far. A row
// whose publish (or delivery lock) goes to one of them is deferred
// without a call, so a node that does not answer costs one publish budget
// per batch, not one per row, and the rows of the other nodes still go
// out: on a Redis Cluster one master failing (stalled, dead until its
// failover, refusing publishes) is not the cluster failing. On a
// standalone Redis every row goes to the one node, and the first failure
// defers the rest of the batch. Once a node failed, the batch goes on for
// at most a delivery lock's life (the rows stay locked in PostgreSQL
// meanwhile) and defers the rows left after that.
type relayBatch struct {
	r      *Relay
	down   map[string]bool
	failed error     // the first node failure
	until  time.Time // set with failed: the rows after it are deferred
}

func (b *relayBatch) fail(node string, err error) error {
	b.down[node] = true
	if b.failed == nil {
		b.failed, b.until = err, time.Now().Add(b.r.deliveryLockTTL())
	}
	return fmt.Errorf("%w: %w", ErrRowDeferred, err)
}

// publish is the batch's Outbox publish callback.
func (b *relayBatch) publish(ctx context.Context, row OutboxRow) error {
	r := b.r
	id := row.EntityID
	if !ids.Valid(id) {
		id = row.EventID
	}
	node := r.nodeOf(ctx, row.Channel)
	if b.down[node] || (b.failed != nil && time.Now().After(b.until)) {
		return ErrRowDeferred
	}
	// The delivery lock is an optimisation next to the row lock the batch
	// holds: when its node fails, the row is published without it.
	var lk *rds.Lock
	if lockNode := r.nodeOf(ctx, rds.LockKey(rds.LockDelivery, id)); !b.down[lockNode] {
		l, _, err := r.locker.Acquire(ctx, rds.LockDelivery, id, r.deliveryLockTTL())
		switch {
		case errors.Is(err, rds.ErrLockHeld):
			return err
		case err != nil:
			deferred := b.fail(lockNode, err)
			if lockNode == node {
				return deferred
			}
		default:
			lk = l
		}
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	raw := rds.Publish(pctx, r.rdb, r.cfg.Mode, row.Channel, row.Payload).Err()
	cancel()
	if lk != nil {
		rctx, rcancel := MarksContext(ctx, r.cfg.PublishTimeout)
		_ = lk.Release(rctx)
		rcancel()
	}
	if raw == nil {
		return nil
	}
	err := rds.ClassifyRedisError(raw)
	// An error reply, and the same server takes the probe: it refuses
	// this row. Otherwise the row's node failed, charging nobody.
	if !rds.Unanswered(raw) && r.publishesGoThrough(ctx, row.Channel) {
		return fmt.Errorf("%w: %w: %w", ErrRowRefusedAlone, ErrRowRefused, err)
	}
	return b.fail(node, err)
}

// nodeOf names the Redis node a call with key (or channel) goes to
// (rds.MasterAddr: "" on a standalone client).
func (r *Relay) nodeOf(ctx context.Context, key string) string {
	return rds.MasterAddr(ctx, r.rdb, key)
}

// publishesGoThrough reports whether Redis takes a publish to the relay's
// probe channel of channel's hash slot (after it refused a row's publish
// on channel).
func (r *Relay) publishesGoThrough(ctx context.Context, channel string) bool {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	return rds.Publish(pctx, r.rdb, r.cfg.Mode, probeChannel(channel), []byte("probe")).Err() == nil
}

// probeChannel is the relay's probe channel on the hash slot of channel.
// On a Redis Cluster a publish goes to the master that owns its channel's
// slot (SPUBLISH, and PUBLISH as the service sends it), and one master may
// refuse every publish (its own ACL, a node in trouble) while the others
// take them: only a probe on the row's own slot asks the server that
// refused the row. The probe's hash tag is the text Redis hashes for
// channel: its own tag (between the first "{" and the next "}", if not
// empty), else the whole name. A name that cannot be quoted as a tag (no
// tag of its own but a "}") gets the smallest decimal number of its slot
// as the tag instead; the numbers below 109,758 cover all 16384 slots.
func probeChannel(channel string) string {
	hashed := channel
	if i := strings.IndexByte(channel, '{'); i >= 0 {
		if j := strings.IndexByte(channel[i+1:], '}'); j > 0 {
			hashed = channel[i+1 : i+1+j]
		}
	}
	if hashed == "" || strings.Contains(hashed, "}") {
		slot := rds.Slot(channel)
		for n := 0; ; n++ {
			if hashed = strconv.Itoa(n); rds.Slot(hashed) == slot {
				break
			}
		}
	}
	return relayProbePrefix + "{" + hashed + "}"
}

// deliveryLockTTL is the life of a row's delivery lock: it covers one
// PUBLISH, so a few publish budgets, not the 30 s of the coordination locks
// that cover longer work. A Redis that stalls instead of failing runs an
// acquire whose caller already timed out when it wakes, and the lock then
// stands for nobody: the row's event waits for it to expire.
func (r *Relay) deliveryLockTTL() time.Duration { return 5 * r.cfg.PublishTimeout }

// Start runs the relay until Close.
func (r *Relay) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return
	}
	r.started = true
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), boundKey{}, r.bound))
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.loop(ctx)
	}()
}

func (r *Relay) loop(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		claimed, published, err := r.RunOnce(ctx)
		wait := r.cfg.Interval
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			backoff = min(max(2*backoff, r.cfg.Interval), r.cfg.MaxBackoff)
			wait = backoff
			r.logger.Warn("outbox relay run failed", slog.String("kind", rds.Kind(err)), slog.Duration("retry_in", wait))
		case claimed >= r.cfg.Batch && published > 0:
			// A full batch that moved: more rows may be waiting. One that
			// published nothing (every row's delivery lock held by another
			// deliverer) would only claim the same rows again at once.
			backoff, wait = 0, 0
		default:
			backoff = 0
		}
		if wait > 0 {
			wait = wait*4/5 + rand.N(wait*2/5+1)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Close is Shutdown with no deadline: the marks of the run in progress
// get their own budget.
func (r *Relay) Close() { r.Shutdown(context.Background()) }

// Shutdown stops the relay and waits for the run in progress: it stops
// publishing at the next row, and the marks of the rows it published
// still go out (MarksContext), unless ctx ends first, which cuts them. The
// instance's shutdown has one deadline, and a stalled PostgreSQL must not
// hold it past that; the rows whose marks were cut stay undelivered, and
// the relay of another instance publishes them again (clients drop the
// duplicate by its event id). Idempotent.
func (r *Relay) Shutdown(ctx context.Context) {
	r.mu.Lock()
	cancel := r.cancel
	r.cancel = nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	stopCut := context.AfterFunc(ctx, r.endBound)
	r.wg.Wait()
	stopCut()
	r.endBound()
}

// boundKey carries, in a run's context, the relay's bound (Shutdown).
type boundKey struct{}

// MarksContext is the context for the work a relay run owes once rows are
// published (their delivered marks, the commit, the release of a delivery
// lock): it outlives the cancellation of the run's ctx, so that a relay
// closed mid-run keeps the marks of what it published, for at most d, and
// ends when the relay's Shutdown runs out of time.
func MarksContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	bound, ok := ctx.Value(boundKey{}).(context.Context)
	if !ok {
		return mctx, cancel
	}
	stop := context.AfterFunc(bound, cancel)
	return mctx, func() {
		stop()
		cancel()
	}
}
