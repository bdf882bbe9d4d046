package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// ServiceConfig configures one instance's realtime side. Zero values of
// the parts pick their defaults; InstanceID is copied from Hub into the
// parts that need it.
type ServiceConfig struct {
	Hub        Config
	Presence   presence.Config
	Subscriber pubsub.SubscriberConfig
	Relay      pubsub.RelayConfig
	// PubSubMode is copied into Subscriber and Relay and given to the
	// publisher, so that the three agree. Zero value means rds.PubSubAuto.
	PubSubMode rds.PubSubMode
	// Registerer receives every part's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Deps are what the realtime side needs.
type Deps struct {
	Config   ServiceConfig
	Logger   *slog.Logger
	Store    *store.Store
	Realtime redis.UniversalClient // DB1
	Verifier TokenVerifier
}

// Service is everything realtime one instance runs: the WebSocket hub, the
// Pub/Sub subscriber and publisher, presence with its sweeper, the outbox
// relay and the tickets. Start starts the background work; Drain, then
// Close, stop it. Safe for concurrent use.
type Service struct {
	cfg        ServiceConfig
	logger     *slog.Logger
	store      *store.Store
	verifier   TokenVerifier
	hub        *Hub
	subscriber *pubsub.Subscriber
	publisher  *pubsub.Publisher
	presence   *presence.Presence
	relay      *pubsub.Relay
	tickets    *Tickets
	handler    *handler

	mu      sync.Mutex // guards started, closed, cancel
	started bool
	closed  bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewService wires the realtime side of an instance.
func NewService(d Deps) (*Service, error) {
	if d.Store == nil || d.Realtime == nil || d.Verifier == nil || d.Logger == nil {
		return nil, errors.New("gateway: Store, Realtime, Verifier and Logger are required")
	}
	cfg := d.Config
	if cfg.Hub.InstanceID == "" {
		return nil, errors.New("gateway: instance id is required")
	}
	cfg.Hub.defaults()
	cfg.Presence.InstanceID = cfg.Hub.InstanceID
	cfg.Subscriber.InstanceID = cfg.Hub.InstanceID
	cfg.Subscriber.Mode, cfg.Relay.Mode = cfg.PubSubMode, cfg.PubSubMode
	cfg.Presence.Registerer, cfg.Subscriber.Registerer, cfg.Relay.Registerer = cfg.Registerer, cfg.Registerer, cfg.Registerer

	s := &Service{cfg: cfg, logger: d.Logger, store: d.Store, verifier: d.Verifier,
		tickets: NewTickets(d.Realtime, cfg.Hub.TicketTTL)}
	var err error
	s.hub = newHub(cfg.Hub, hubDeps{Store: d.Store, Verifier: d.Verifier, Recovery: d.Store}, d.Logger)
	delivery, err := newDeliveryObserver(cfg.Registerer) // delivery_metrics.go
	if err != nil {
		return nil, err
	}
	dispatch := delivery.wrap(s.hub.Dispatch)
	s.subscriber, err = pubsub.NewSubscriber(d.Realtime, cfg.Subscriber, d.Logger, dispatch,
		func(channels []string) { s.hub.resyncChannels(channels, ResyncReconnect) })
	if err != nil {
		return nil, err
	}
	s.publisher = pubsub.NewPublisher(d.Realtime, cfg.PubSubMode, s.subscriber, dispatch)
	pcfg := cfg.Presence
	pcfg.Refused = s.closeOverCap
	if s.presence, err = presence.New(d.Realtime, pcfg, s, d.Logger); err != nil {
		return nil, err
	}
	if s.relay, err = pubsub.NewRelay(d.Store, d.Realtime, cfg.Relay, d.Logger); err != nil {
		return nil, err
	}
	s.hub.deps.Subscriber, s.hub.deps.Publisher, s.hub.deps.Presence = s.subscriber, s.publisher, s.presence
	origins := map[string]struct{}{}
	for _, o := range cfg.Hub.AllowedOrigins {
		origins[o] = struct{}{}
	}
	s.handler = &handler{s: s, origins: origins}
	if cfg.Registerer != nil {
		if err := registerHubMetrics(cfg.Registerer, s.hub); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start starts the Pub/Sub link, presence (liveness, heartbeats, sweeper),
// the outbox relay and the WebSocket pings. It does not wait for Redis.
func (s *Service) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	s.subscriber.Start()
	s.presence.Start(s.hub.presenceConns)
	s.relay.Start()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.hub.pingLoop(ctx)
	}()
}

// Handler serves GET /v1/realtime.
func (s *Service) Handler() http.Handler { return s.handler }

// Publisher publishes event frames (the REST API's publish after commit).
func (s *Service) Publisher() *pubsub.Publisher { return s.publisher }

// IssueTicket issues a one-time WebSocket ticket for userID, asked for
// with a token that expires at tokenExpires; the socket the ticket opens
// closes when that token would (4001 token_expired).
func (s *Service) IssueTicket(ctx context.Context, userID string, tokenExpires time.Time) (string, time.Time, error) {
	return s.tickets.Issue(ctx, userID, tokenExpires)
}

// OnlineConnections returns the user's live connection count (any instance).
func (s *Service) OnlineConnections(ctx context.Context, userID string) (int, error) {
	return s.presence.Online(ctx, userID)
}

// PubSubHealthy reports whether this instance's Pub/Sub link is up and the
// canary is fresh (for /readyz).
func (s *Service) PubSubHealthy() bool { return s.subscriber.Healthy() }

// Stats returns the hub's counters.
func (s *Service) Stats() Stats { return s.hub.Stats() }

// Drain closes every connection with 1001 and a reconnect delay, in
// batches, and waits for them to go (or ctx to end). New connections are
// refused with 1001 from now on.
func (s *Service) Drain(ctx context.Context) error { return s.hub.drain(ctx) }

// Close ends what is left, removes this instance from presence and stops
// the background work, each step within a budget of its own. Idempotent.
func (s *Service) Close() {
	s.shutdown(context.Background(), false)
}

// Shutdown is Close within ctx: the steps that wait on Redis or PostgreSQL
// (the presence removals, the deregistration, the wait for the offline
// transitions, the relay's marks) spend at most what is left of it, so a
// stalled dependency does not hold the instance past its stop budget.
// What a cut step leaves is not lost: presence entries stay in this
// instance's index for the survivors' sweep, and outbox rows stay
// undelivered for another instance's relay.
func (s *Service) Shutdown(ctx context.Context) {
	s.shutdown(ctx, false)
}

// Kill stops the instance as a crash would: connections drop without
// close frames and nothing is removed from Redis; the survivors' sweeper
// cleans up. For fault drills and tests.
func (s *Service) Kill() {
	s.shutdown(context.Background(), true)
}

func (s *Service) shutdown(ctx context.Context, kill bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	cancel := s.cancel
	s.mu.Unlock()
	// The REST sends' publishes still queued go out first (the HTTP server
	// stopped before this), so their delivered marks are queued before the
	// API flushes them.
	s.publisher.Close()
	if kill {
		s.hub.killed.Store(true)
		s.presence.Close()
		s.relay.Close()
		s.subscriber.Close()
	}
	s.hub.closeAll(ctx)
	if !kill {
		dctx, cancelDereg := context.WithTimeout(ctx, 2*time.Second)
		if err := s.presence.Deregister(dctx); err != nil {
			s.logger.Warn("instance deregistration failed; survivors will sweep it", slog.String("kind", store.Kind(err)))
		}
		cancelDereg()
		// Offline checks of the drained users run at their time (bounded);
		// those still pending at the end are handed on by Deregister.
		// The wait is bounded; the callbacks already telling other
		// instances are cut only at the shutdown's own deadline.
		s.presence.Shutdown(ctx, s.presence.Config().OfflineDebounce+time.Second)
		s.relay.Shutdown(ctx)
		s.subscriber.Close()
	}
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
}

// Online implements presence.Events: the user's first live connection.
func (s *Service) Online(ctx context.Context, userID string, at time.Time) {
	s.publishPresence(ctx, userID, true, nil, at.UnixMilli())
}

// Offline implements presence.Events: the user's last connection ended at.
func (s *Service) Offline(ctx context.Context, userID string, at time.Time) {
	if err := s.store.TouchLastSeen(ctx, userID, at); err != nil {
		s.logger.Warn("last seen not recorded", slog.String("kind", store.Kind(err)))
	}
	ms := at.UnixMilli()
	s.publishPresence(ctx, userID, false, &ms, ms)
}

// maxPresenceDialogs bounds the dialogs one transition is published to:
// the user's most recent ones, as the dialog listing orders them
// (store.DialogIDsForUser). The members of the user's older dialogs read
// the user's presence over REST (docs/realtime-protocol.md).
const maxPresenceDialogs = 1000

// publishPresence publishes a transition to each of the user's most recent
// dialogs. The publishes join the publisher's shared pipelines
// (pubsub.Publisher.PublishLater) instead of going out one round trip
// after another: a transition costs its share of one batched PostgreSQL
// read and of the pipelines that carry its publishes (a few dozen each,
// in flight together), and while Redis does not answer it waits for one
// pipeline's budget, not one per dialog. Each dialog's publish succeeds or
// fails on its own; a failed one still reaches this instance's sockets
// (the publisher's local fallback). It returns once every publish is
// answered (or ctx ends), so the user's next transition is handed to
// Pub/Sub after this one.
//
// Once the service is closing, the publisher takes no more publishes that
// nobody waits for (Close sent the last of them), while the offline
// transitions of the users it drained are still due: those are published
// one by one and waited for, within ctx.
func (s *Service) publishPresence(ctx context.Context, userID string, online bool, lastSeen *int64, changedAt int64) {
	dialogs, err := s.store.DialogIDsForUser(ctx, userID, maxPresenceDialogs)
	if err != nil {
		s.logger.Warn("presence transition not published", slog.String("kind", store.Kind(err)))
		return
	}
	data := mustJSON(presenceData{UserID: userID, Online: online, LastSeenAt: lastSeen, ChangedAt: changedAt})
	s.mu.Lock()
	closing := s.closed
	s.mu.Unlock()
	fan := newPresenceFanout(s.logger, len(dialogs))
	for _, d := range dialogs {
		payload, err := pubsub.NewDialogEvent(ids.New(), EventPresenceChanged, userID, d, 0, data).Encode()
		switch {
		case err != nil:
			fan.done(nil)
		case closing:
			fan.done(s.publisher.Publish(ctx, pubsub.DialogChannel(d), payload))
		default:
			s.publisher.PublishLater(pubsub.DialogChannel(d), payload, fan.done)
		}
		if ctx.Err() != nil {
			return
		}
	}
	select {
	case <-fan.answered:
	case <-ctx.Done():
	}
}

// presenceFanout follows the publishes of one transition.
type presenceFanout struct {
	logger   *slog.Logger
	left     atomic.Int64  // publishes not answered yet
	failed   atomic.Bool   // one log line per transition, not per dialog
	answered chan struct{} // closed once left reaches zero
}

func newPresenceFanout(logger *slog.Logger, n int) *presenceFanout {
	f := &presenceFanout{logger: logger, answered: make(chan struct{})}
	f.left.Store(int64(n))
	if n == 0 {
		close(f.answered)
	}
	return f
}

// done records one publish's outcome; it may run on the publisher's
// goroutine, and is short.
func (f *presenceFanout) done(err error) {
	if err != nil && !f.failed.Swap(true) {
		f.logger.Debug("presence transition publish failed", slog.String("kind", store.Kind(err)))
	}
	if f.left.Add(-1) == 0 {
		close(f.answered)
	}
}

var _ presence.Events = (*Service)(nil)

// String names the service in logs.
func (s *Service) String() string { return fmt.Sprintf("gateway(%s)", s.cfg.Hub.InstanceID) }
