package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// canaryChannelPrefix + instance id is the instance-private channel the
// canary publishes to.
const canaryChannelPrefix = "han:rt:canary:"

// CanaryChannel is the instance-private canary channel.
func CanaryChannel(instanceID string) string { return canaryChannelPrefix + instanceID }

// SubscriberConfig tunes a Subscriber.
type SubscriberConfig struct {
	InstanceID string // required: names the canary channel
	// CanaryInterval is how often the canary publishes. Zero value means 2s.
	CanaryInterval time.Duration
	// CanaryDeadline: a link on which nothing at all was read for this
	// long (no canary, message, confirmation or, on a cluster, PONG to the
	// PING sent every CanaryInterval) is treated as dead and reconnected;
	// a link that reads, however far behind, is not. The subscriber
	// reports itself unhealthy once no canary (on a cluster, also no PONG
	// of a shard) arrived for this long. Zero value means 3 ×
	// CanaryInterval.
	CanaryDeadline time.Duration
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff
	// between reconnect attempts. Zero values mean 100ms and 5s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// BatchSize is the most channels one SUBSCRIBE/UNSUBSCRIBE command
	// carries. Zero value means 500.
	BatchSize int
	// MaxMessageBytes bounds a message's payload. A larger one is dropped
	// while it is read off the link, never held in memory whole, and its
	// channel is handed to OnResync (its sockets missed a message); the
	// link stays up. Zero value means 1 MiB, the outbound queue of one
	// socket: no socket could take a larger event anyway. Values under
	// 1 KiB mean 1 KiB (the limit applies to channel names too).
	MaxMessageBytes int
	// Registerer receives the subscriber's metrics; nil means none.
	Registerer prometheus.Registerer
	// Mode chooses sharded or classic Pub/Sub. Zero value means
	// rds.PubSubAuto: sharded on a Redis Cluster client, classic on a
	// standalone one. Sharded on a standalone client fails NewSubscriber.
	Mode rds.PubSubMode
}

func (c *SubscriberConfig) defaults() {
	if c.CanaryInterval <= 0 {
		c.CanaryInterval = 2 * time.Second
	}
	if c.CanaryDeadline <= 0 {
		c.CanaryDeadline = 3 * c.CanaryInterval
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 5 * time.Second
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 1 << 20
	}
	c.MaxMessageBytes = max(c.MaxMessageBytes, 1<<10)
}

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("pubsub: subscriber closed")

var errCanaryLost = rds.Named("canary_lost", "pubsub: canary lost")

// What was last sent to Redis for a channel.
const (
	sentNone int8 = iota
	sentSubscribe
	sentUnsubscribe
)

// chanState is one channel's state; every connection's user channel has
// one, so its fields are ordered to keep it small (104 bytes on 64-bit:
// the 112-byte size class).
type chanState struct {
	refs        int
	counted     bool // refs > 0 and not the canary: counted in Subscriber.live and shard.live
	pendingSubs int  // SUBSCRIBE confirmations outstanding
	waiters     []chan struct{}
	// On a cluster: the shard the channel is subscribed on (nil while
	// unassigned), and whether its traffic may have been lost since it
	// was last confirmed (a shard failure, a slot move).
	shard     *shard
	sent      int8
	confirmed bool // the last SUBSCRIBE sent is confirmed
	lost      bool
	retry     bool // back from a failure: routed again from retryAt on, not at once
	// leftAddr is the master that ended the channel's subscription itself
	// (its slot moved away), until leftUntil: a slot map naming it again
	// before then was read from a node that had not yet learned of the
	// move.
	leftAddr  string
	leftUntil time.Time
}

// Subscriber is an instance's single Redis Pub/Sub connection, shared by
// every local socket. Channels are reference counted: the first Subscribe
// of a channel sends SUBSCRIBE, the last Unsubscribe sends UNSUBSCRIBE, and
// pending changes go out in batches. The link is read with a Receive loop,
// so a dropped connection is seen: the subscriber reconnects with jittered
// exponential backoff, resubscribes every channel in one batch and, once
// Redis confirmed them, calls OnResync with the channels whose traffic may
// have been lost. A canary on an instance-private channel measures the
// link's lag and detects a silently dead link. On a Redis Cluster (unless
// Mode is classic) the same reference counting drives sharded Pub/Sub instead: one SSUBSCRIBE
// connection per master, and after a failure only the channels of the
// failed master or moved slot are resubscribed and resynced (sharded.go).
//
// All methods are safe for concurrent use. OnMessage runs on the receive
// goroutine (on a cluster, one per shard, concurrently) and must not block.
type Subscriber struct {
	cfg       SubscriberConfig
	rdb       redis.UniversalClient
	logger    *slog.Logger
	onMessage func(channel string, payload []byte)
	onResync  func(channels []string)
	canary    string
	metrics   subscriberMetrics

	// cluster is set when the channels are sharded (a Redis Cluster
	// client and Mode auto or sharded): sharded Pub/Sub (sharded.go).
	cluster         *redis.ClusterClient
	shardReconnects *prometheus.CounterVec
	shardLag        *prometheus.GaugeVec

	// live is how many channels other than the canary have references,
	// changed with chans (under mu) and read without it (Channels), so a
	// metrics scrape never waits for, nor holds up, a publish or subscribe.
	live    atomic.Int64
	mu      sync.Mutex // guards chans, dirty, ps, up, closed, and on a cluster shards, hooked, downShards, reload, retryAt, backoff, lostN
	chans   map[string]*chanState
	dirty   map[string]struct{}
	ps      *redis.PubSub // current session, nil while disconnected
	up      bool          // the current session's initial SUBSCRIBE is confirmed
	closed  bool
	started bool

	shards map[string]*shard // by master address
	// hooked: the masters' clients given limitHook.
	hooked map[*redis.Client]struct{}
	// downShards: lost shards whose channels are not confirmed elsewhere yet.
	downShards map[string]struct{}
	reload     bool      // the router must read the slot map afresh
	retryAt    time.Time // channels back from a failure are routed again from then on
	backoff    time.Duration
	lostN      int // channels marked lost

	kick        chan struct{} // wakes the flusher
	lastCanary  atomic.Int64  // unix ns of the last canary received
	canaryLagNs atomic.Int64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type subscriberMetrics struct {
	reconnects prometheus.Counter
	messages   prometheus.Counter
	oversized  prometheus.Counter
	lag        prometheus.Gauge
	linkUp     prometheus.Gauge
}

// NewSubscriber creates a subscriber on the DB1 client. onMessage receives
// every message of a subscribed channel (the payload slice is shared and
// must not be modified: it is the received message's own memory, see
// payloadBytes); onResync receives the channels resubscribed after
// a reconnect. Start starts it.
func NewSubscriber(rdb redis.UniversalClient, cfg SubscriberConfig, logger *slog.Logger,
	onMessage func(channel string, payload []byte), onResync func(channels []string)) (*Subscriber, error) {
	if rdb == nil || cfg.InstanceID == "" || onMessage == nil || logger == nil {
		return nil, errors.New("pubsub: client, instance id, logger and message handler are required")
	}
	cfg.defaults()
	sharded, err := rds.ShardedPubSub(rdb, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	if onResync == nil {
		onResync = func([]string) {}
	}
	s := &Subscriber{cfg: cfg, rdb: rdb, logger: logger, onMessage: onMessage, onResync: onResync,
		canary: CanaryChannel(cfg.InstanceID), chans: map[string]*chanState{}, dirty: map[string]struct{}{},
		kick: make(chan struct{}, 1), shards: map[string]*shard{}, hooked: map[*redis.Client]struct{}{},
		downShards: map[string]struct{}{}}
	if sharded {
		s.cluster = rdb.(*redis.ClusterClient)
	} else {
		// The shard connections get it from their master's client.
		rdb.AddHook(limitHook{})
	}
	s.metrics = subscriberMetrics{
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_pubsub_reconnects_total",
			Help: "Redis Pub/Sub link re-establishments after a drop."}),
		messages: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_pubsub_messages_total",
			Help: "Pub/Sub messages received (canary excluded)."}),
		oversized: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_pubsub_oversized_messages_total",
			Help: "Pub/Sub messages dropped while read because their payload exceeded the limit (1 MiB by default) or was empty; their channel was resynced."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "han_pubsub_canary_lag_seconds",
			Help: "Publish-to-receive lag of the last canary on this instance's Pub/Sub link."}),
		linkUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "han_pubsub_link_up",
			Help: "1 while the Pub/Sub link is connected and its subscriptions are confirmed."}),
	}
	if cfg.Registerer != nil {
		channels := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "han_pubsub_channels",
			Help: "Channels this instance is subscribed to."}, func() float64 {
			return float64(s.Channels())
		})
		for _, c := range []prometheus.Collector{s.metrics.reconnects, s.metrics.messages, s.metrics.oversized, s.metrics.lag, s.metrics.linkUp, channels} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if err := s.newShardMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts the connection loop. It returns at once; the link comes up
// in the background (and is retried while Redis is down).
func (s *Subscriber) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	if s.cluster != nil {
		// The canary is a shard channel like the others; it proves
		// the path SPUBLISH → shard → this instance end to end.
		s.addLocked(s.canary)
		s.wake()
		go func() {
			defer s.wg.Done()
			s.runSharded(ctx)
		}()
		return
	}
	go func() {
		defer s.wg.Done()
		s.run(ctx)
	}()
}

// Close stops the subscriber and waits for its goroutines. Idempotent.
func (s *Subscriber) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for _, st := range s.chans {
		for _, w := range st.waiters {
			close(w)
		}
		st.waiters = nil
	}
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
}

// Healthy reports whether the link is up, its subscriptions confirmed and
// the canary recently seen.
func (s *Subscriber) Healthy() bool {
	if s.cluster != nil {
		return s.shardedHealthy()
	}
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	return up && time.Since(time.Unix(0, s.lastCanary.Load())) <= s.cfg.CanaryDeadline
}

// CanaryLag is the lag of the last canary received.
func (s *Subscriber) CanaryLag() time.Duration { return time.Duration(s.canaryLagNs.Load()) }

func (s *Subscriber) addLocked(channel string) *chanState {
	st := s.chans[channel]
	if st == nil {
		st = &chanState{}
		s.chans[channel] = st
	}
	st.refs++
	if st.refs == 1 && channel != s.canary {
		s.setCountedLocked(st, true)
	}
	if !(st.sent == sentSubscribe) {
		s.dirty[channel] = struct{}{}
	}
	return st
}

// Subscribe takes a reference on channel and returns once Redis has
// confirmed the subscription, so every message published afterwards
// reaches OnMessage. On error (ctx done, Close) the reference is released.
func (s *Subscriber) Subscribe(ctx context.Context, channel string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	st := s.addLocked(channel)
	if st.confirmed && st.sent == sentSubscribe {
		s.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	st.waiters = append(st.waiters, w)
	s.mu.Unlock()
	s.wake()
	select {
	case <-w:
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		// The waiter goes with its caller: callers that give up one after
		// another while Redis stalls leave nothing behind.
		s.mu.Lock()
		if st := s.chans[channel]; st != nil {
			st.waiters = slices.DeleteFunc(st.waiters, func(x chan struct{}) bool { return x == w })
		}
		s.mu.Unlock()
		s.Unsubscribe(channel)
		return ctx.Err()
	}
}

// Join takes a reference on channel only when the instance already holds
// its confirmed subscription (no Redis work, no wait), as Subscribe would
// return at once; it reports whether it took one. A caller that must not
// make the instance subscribe on its behalf (an unauthorized channel) can
// Join first and check afterwards.
func (s *Subscriber) Join(channel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.chans[channel]
	if s.closed || st == nil || st.refs == 0 || !st.confirmed || st.sent != sentSubscribe {
		return false
	}
	st.refs++
	return true
}

// Unsubscribe releases one reference; the last one unsubscribes in Redis.
func (s *Subscriber) Unsubscribe(channel string) {
	s.mu.Lock()
	st := s.chans[channel]
	if st == nil || st.refs == 0 {
		s.mu.Unlock()
		return
	}
	st.refs--
	if st.refs == 0 {
		s.dirty[channel] = struct{}{}
		if channel != s.canary {
			s.setCountedLocked(st, false)
		}
	}
	s.mu.Unlock()
	s.wake()
}

// Channels returns the number of channels with references (the canary's
// aside), without taking the subscriber's lock.
func (s *Subscriber) Channels() int { return int(s.live.Load()) }

func (s *Subscriber) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Subscriber) run(ctx context.Context) {
	backoff := s.cfg.ReconnectMin
	for ctx.Err() == nil {
		wasUp, err := s.session(ctx)
		s.mu.Lock()
		s.ps, s.up = nil, false
		for _, st := range s.chans {
			st.confirmed = false
		}
		s.mu.Unlock()
		s.metrics.linkUp.Set(0)
		if ctx.Err() != nil {
			return
		}
		if wasUp {
			s.metrics.reconnects.Inc()
			backoff = s.cfg.ReconnectMin
			s.logger.Warn("pubsub link lost; reconnecting", slog.String("kind", rds.Kind(err)))
		}
		// Full jitter: sleep a random time in [backoff/2, backoff].
		d := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
}

// attach makes ps the session's connection and returns the channels it
// must subscribe to again: every one still referenced, marked as sent and
// unconfirmed; channels nobody holds any more are dropped.
func (s *Subscriber) attach(ps *redis.PubSub) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ps = ps
	initial := make([]string, 0, len(s.chans)+1)
	for ch, st := range s.chans {
		if st.refs == 0 {
			delete(s.chans, ch)
			continue
		}
		st.sent, st.pendingSubs, st.confirmed = sentSubscribe, 1, false
		initial = append(initial, ch)
	}
	clear(s.dirty)
	return initial
}

// session runs one Pub/Sub connection until it fails. wasUp reports
// whether its subscriptions had been confirmed (a drop after that is a
// reconnect the sockets must hear about).
func (s *Subscriber) session(ctx context.Context) (wasUp bool, err error) {
	sctx, cancel := context.WithCancel(s.limited(ctx))
	defer cancel()
	ps := s.rdb.Subscribe(sctx)
	defer ps.Close()
	// A blocked read ends at once when the session is cancelled.
	stop := context.AfterFunc(sctx, func() { _ = ps.Close() })
	defer stop()

	initial := s.attach(ps)
	awaiting := make(map[string]struct{}, len(initial)+1)
	awaiting[s.canary] = struct{}{}
	for _, ch := range initial {
		awaiting[ch] = struct{}{}
	}
	if err := s.send(sctx, ps, "subscribe", append([]string{s.canary}, initial...)); err != nil {
		return false, err
	}

	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	// Anything read shows the link alive. Until the session is up that
	// is the initial batch's confirmations, which come in order, one per
	// channel, however many there are (a canary published meanwhile may
	// wait behind all of them); after, the canary, published every
	// CanaryInterval, and the messages, behind which the canary waits
	// under a flood however well the link reads. A link that read nothing
	// for CanaryDeadline (it went silent: a stalled Redis, a half-open TCP
	// link) is ended.
	var lost atomic.Bool
	var heard atomic.Int64
	heard.Store(time.Now().UnixNano())
	goAll(&bg, func() { s.flushLoop(sctx, ps) }, func() { s.canaryLoop(sctx) }, func() {
		s.watch(sctx, func() bool {
			return time.Since(time.Unix(0, heard.Load())) > s.cfg.CanaryDeadline
		}, func() { lost.Store(true); cancel() })
	})

	up := false
	for {
		// No read deadline: one that passed in the middle of a message
		// (a Redis that stalled while writing it) would leave the rest of
		// it to be parsed as the next reply, and the message lost without
		// a resync. The watchdog ends the session instead.
		msg, err := ps.Receive(sctx)
		if err != nil {
			if lost.Load() {
				return up, errCanaryLost
			}
			return up, err
		}
		heard.Store(time.Now().UnixNano())
		switch m := msg.(type) {
		case *redis.Message:
			s.deliver(m.Channel, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" && !up {
				delete(awaiting, m.Channel)
			}
			s.confirm(m.Kind, m.Channel)
			if !up && len(awaiting) == 0 {
				up = true
				s.lastCanary.Store(time.Now().UnixNano())
				s.mu.Lock()
				s.up = true
				s.mu.Unlock()
				s.metrics.linkUp.Set(1)
				if len(initial) > 0 {
					s.onResync(initial)
				}
				s.wake()
			}
		}
	}
}

func (s *Subscriber) send(ctx context.Context, ps *redis.PubSub, cmd string, channels []string) error {
	for len(channels) > 0 {
		n := min(len(channels), s.cfg.BatchSize)
		var err error
		if cmd == "subscribe" {
			err = ps.Subscribe(ctx, channels[:n]...)
		} else {
			err = ps.Unsubscribe(ctx, channels[:n]...)
		}
		if err != nil {
			return err
		}
		channels = channels[n:]
	}
	return nil
}

// confirm applies a SUBSCRIBE/UNSUBSCRIBE confirmation from Redis.
func (s *Subscriber) confirm(kind, channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.chans[channel]
	if st == nil {
		return
	}
	switch kind {
	case "subscribe":
		if st.pendingSubs > 0 {
			st.pendingSubs--
		}
		if st.pendingSubs == 0 && st.sent == sentSubscribe {
			st.confirmed = true
			for _, w := range st.waiters {
				close(w)
			}
			st.waiters = nil
		}
	case "unsubscribe":
		if st.sent == sentUnsubscribe && st.pendingSubs == 0 {
			if st.refs == 0 {
				delete(s.chans, channel)
			} else {
				s.dirty[channel] = struct{}{}
			}
		}
	}
}

// flushLoop sends the batched SUBSCRIBE/UNSUBSCRIBE commands that
// reference changes require.
func (s *Subscriber) flushLoop(ctx context.Context, ps *redis.PubSub) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		s.mu.Lock()
		if s.ps != ps || !s.up {
			// The initial batch is still in flight; the session wakes us
			// again once it is confirmed.
			s.mu.Unlock()
			continue
		}
		var subs, unsubs []string
		for ch := range s.dirty {
			st := s.chans[ch]
			switch {
			case st == nil:
			case st.refs > 0 && st.sent != sentSubscribe:
				st.sent, st.confirmed = sentSubscribe, false
				st.pendingSubs++
				subs = append(subs, ch)
			case st.refs == 0 && st.sent == sentSubscribe:
				st.sent, st.confirmed = sentUnsubscribe, false
				unsubs = append(unsubs, ch)
			case st.refs == 0 && st.sent == sentNone:
				delete(s.chans, ch)
			}
		}
		clear(s.dirty)
		s.mu.Unlock()
		err := s.send(ctx, ps, "unsubscribe", unsubs)
		if err == nil {
			err = s.send(ctx, ps, "subscribe", subs)
		}
		if err != nil {
			// The receive loop sees the broken link too; closing makes sure.
			_ = ps.Close()
			return
		}
	}
}

// payloadBytes is a received message's payload as bytes without a copy:
// the slice aliases the string go-redis built for this one message, which
// nothing else holds or changes. Strings are immutable, so the bytes are
// read-only for every receiver — the hub forwards them to sockets and
// keeps them for recovery, and writes into them nowhere. The copy this
// saves was the largest allocation per event of the fan-out.
func payloadBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// deliver hands a received message to OnMessage (the canary's to the lag
// measurement). An empty payload is what bulkLimiter leaves of a message
// over MaxMessageBytes (and no event is empty): the channel's sockets
// missed a message and are resynced.
func (s *Subscriber) deliver(channel, payload string) {
	switch {
	case channel == s.canary:
		s.canaryReceived(payload)
	case payload == "":
		s.metrics.oversized.Inc()
		s.onResync([]string{channel})
	default:
		s.metrics.messages.Inc()
		s.onMessage(channel, payloadBytes(payload))
	}
}
