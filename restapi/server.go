package restapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/docs"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/ratelimit"
	projectapi "github.com/han-app/gateway/restapi/project"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// Version is the build's version, reported by /v1/public/config.
var Version = "dev"

// TokenVerifier checks bearer tokens (implemented by auth.Verifier).
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (auth.Principal, error)
}

// Publisher sends a realtime event's bytes to a Redis Pub/Sub channel.
type Publisher interface {
	Publish(ctx context.Context, channel string, payload []byte) error
}

// Config holds the HTTP-facing settings.
type Config struct {
	// MetricsElsewhere drops /metrics from this router (the process serves
	// it on a separate listener). Zero value: /metrics is served here.
	MetricsElsewhere bool
	HMACSecret       []byte
	// PublicRealtimeURL is the realtimeUrl of /v1/public/config. Empty:
	// ws(s)://<Host>/v1/realtime when the Host header names loopback, else
	// null (the client derives it from its page's origin), because a Host
	// chosen by the client must never come back as a URL others may cache.
	PublicRealtimeURL string
	// TrustedProxies are the peers whose forwarding headers name the client
	// (clientip.go); empty: forwarding headers are ignored.
	TrustedProxies []netip.Prefix
	// ForwardedHeader is the header those proxies write: "forwarded"
	// (RFC 7239), else X-Forwarded-For with X-Forwarded-Proto.
	ForwardedHeader string
	// BodyTimeout is the base of the body read and response write
	// deadlines (deadlines.go); zero value means 15s.
	BodyTimeout    time.Duration
	PublishTimeout time.Duration // zero value means 1s
	ReadyTimeout   time.Duration // zero value means 500ms per dependency
	// Idempotency and Attachments: see idempotency.go and attachments.go.
	Idempotency IdempotencyConfig
	Attachments AttachmentConfig
	// Env is HAN_ENV, part of every project physical key
	// han:prj:{<env>:<project_id>}:…; zero value means "dev".
	Env string
	// EvictionPolicyTTL is how long the project API caches Redis's
	// maxmemory-policy (INFO memory); zero value means 3s.
	EvictionPolicyTTL time.Duration
	// ProjectQueue tunes topics, claims and budgets of the project API
	// (package store/project); zero values mean the defaults.
	ProjectQueue project.QueueConfig
	// CORSOrigins are the exact origins (HAN_CORS_ORIGINS) whose pages may
	// call the REST API from a browser (cors.go); empty: no CORS headers.
	CORSOrigins []string
	// AuthFailures is each client address's budget of refused credentials
	// (HAN_AUTH_FAIL_BURST, HAN_AUTH_FAIL_RATE; authfail.go); zero values
	// mean the defaults.
	AuthFailures AuthFailConfig
}

// Pinger is a PostgreSQL connection the readiness probe pings.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Deps are the collaborators of the API server.
type Deps struct {
	Config Config
	Logger *slog.Logger
	Store  *store.Store
	// ReadyPG is the readiness probe's own PostgreSQL connection
	// (store.OpenReadinessPG), so a saturated request pool never reads as
	// "down"; nil: the probe pings through Store's request pool.
	ReadyPG  Pinger
	Redis    redis.UniversalClient // DB0
	Realtime redis.UniversalClient // DB1
	Verifier TokenVerifier
	Metrics  *Metrics
	// Publisher defaults to publishing on the DB1 client in the auto
	// Pub/Sub mode (rds.PubSubAuto); the service passes its gateway's
	// publisher, which follows HAN_PUBSUB_MODE.
	Publisher Publisher
	// RateLimiter, when set, is consulted on every limited route (seam for
	// the Redis Lua limiter).
	RateLimiter RateLimiter
	// RedisHealth is DB0's fast-failure state; nil: NewServer makes one
	// (closed by Server.Close).
	RedisHealth *rds.RedisHealth
	// Blobs stores attachment bytes; nil: a local folder
	// (Config.Attachments.BlobDir).
	Blobs store.BlobStore
	// RateLimits, when set and RateLimiter is not, becomes the RateLimiter:
	// route policies evaluated in Redis, with 429/503 rendered by fail.
	RateLimits *ratelimit.Limiter
	// Gateway, when set, serves GET /v1/realtime, the ticket and presence
	// endpoints, and feeds /readyz (realtime.go).
	Gateway RealtimeGateway
	// LegacyStub, when set, turns the legacy DB2 safety stub on (safety.go).
	LegacyStub *legacystub.Stub
}

// Server is the REST API. Mount additional handlers (the WebSocket
// endpoint) on Router before serving. Safe for concurrent use.
type Server struct {
	cfg        Config
	logger     *slog.Logger
	store      *store.Store
	readyPG    Pinger      // readiness probe's own connection
	ready      readyChecks // the checks /readyz shares between probes (readiness.go)
	rdb        redis.UniversalClient
	rt         redis.UniversalClient
	verifier   TokenVerifier
	metrics    *Metrics
	publisher  Publisher
	limiter    RateLimiter
	hmacSecret []byte
	// authFails counts each client address's refused credentials
	// (authfail.go).
	authFails *ratelimit.FailBudget
	// marker records published outbox rows as delivered in batches;
	// created by NewServer, flushed and stopped by Close.
	marker *store.OutboxMarker

	router   *mux.Router
	v1       *mux.Router
	draining atomic.Bool
	idem     *idempotency    // idempotency keys and DB0 health (idempotency.go)
	att      *attachments    // attachment settings and blob store (attachments.go)
	prj      *projectapi.API // the project Redis API (restapi/project)
	gw       RealtimeGateway
	stub     *legacystub.Stub // nil: the legacy safety stub is off (safety.go)
	// db0Routes are the routes whose handlers apply the DB0 outage rule
	// themselves, by rate-limit label (ratelimit.Label: a HEAD is its
	// route's GET; answersDB0Outage in db0outage.go; written only while the
	// routes are registered).
	db0Routes map[string]db0Route

	corsOrigins map[string]bool // CORSOrigins as a set
	openapi     []byte          // docs/openapi.yaml as JSON, built once by NewServer

}

type redisPublisher struct{ c redis.UniversalClient }

func (p redisPublisher) Publish(ctx context.Context, channel string, payload []byte) error {
	return rds.ClassifyRedisError(rds.Publish(ctx, p.c, rds.PubSubAuto, channel, payload).Err())
}

// NewServer builds the router with every route of the foundation.
func NewServer(d Deps) (*Server, error) {
	if d.Store == nil || d.Verifier == nil || d.Logger == nil {
		return nil, errors.New("restapi: Store, Verifier and Logger are required")
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Config.PublishTimeout == 0 {
		d.Config.PublishTimeout = time.Second
	}
	if d.Config.BodyTimeout == 0 {
		d.Config.BodyTimeout = 15 * time.Second
	}
	if d.Config.ReadyTimeout == 0 {
		d.Config.ReadyTimeout = 500 * time.Millisecond
	}
	s := &Server{
		cfg: d.Config, logger: d.Logger, store: d.Store, readyPG: d.ReadyPG, rdb: d.Redis, rt: d.Realtime,
		verifier: d.Verifier, metrics: d.Metrics, publisher: d.Publisher, limiter: d.RateLimiter,
		hmacSecret: d.Config.HMACSecret,
	}
	if s.readyPG == nil {
		s.readyPG = d.Store
	}
	s.initAuthFails(d.Config.AuthFailures)    // authfail.go
	if err := s.initReadiness(); err != nil { // readiness.go
		return nil, err
	}
	if s.limiter == nil && d.RateLimits != nil {
		s.limiter = &redisRateLimiter{s: s, l: d.RateLimits}
	}
	if s.publisher == nil && s.rt != nil {
		s.publisher = redisPublisher{s.rt}
	}
	s.gw = d.Gateway
	s.stub = d.LegacyStub
	var err error
	if s.openapi, err = docs.OpenAPIJSON(); err != nil {
		return nil, err
	}
	s.corsOrigins = make(map[string]bool, len(d.Config.CORSOrigins))
	for _, o := range d.Config.CORSOrigins {
		s.corsOrigins[o] = true
	}
	if s.marker, err = store.NewOutboxMarker(d.Store, store.OutboxMarkerConfig{Registerer: s.metrics.Registry}, d.Logger); err != nil {
		return nil, err
	}
	s.initIdempotency(d)
	if err := s.initAttachments(d); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// Router is the root router (for mounting the realtime endpoint).
func (s *Server) Router() *mux.Router { return s.router }

// Metrics returns the registry holder.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler is the complete HTTP handler, every route under the body and
// response deadlines.
func (s *Server) Handler() http.Handler {
	return s.deadlines(s.observe(s.cors(s.realtimeFirst(canonicalPath(s.router)))))
}

// SetDraining makes /readyz answer 503 so the load balancer stops sending
// new traffic while in-flight requests finish.
func (s *Server) SetDraining() { s.draining.Store(true) }

func (s *Server) routes() {
	r := mux.NewRouter()
	r.Use(routeName)
	// gorilla/mux v1.8.1 reports a method mismatch inside a subrouter as
	// "not found"; notFound tells the two apart itself.
	r.NotFoundHandler = http.HandlerFunc(s.notFound)
	// The web client's catch-all GET route would turn every unknown path
	// into a method mismatch: notFound decides between 404 and 405.
	r.MethodNotAllowedHandler = http.HandlerFunc(s.notFound)

	r.HandleFunc("/healthz", s.healthz).Methods(readMethods...)
	r.HandleFunc("/readyz", s.readyz).Methods(readMethods...)
	if !s.cfg.MetricsElsewhere {
		r.Handle("/metrics", s.metrics.Handler()).Methods(readMethods...)
	}
	r.Handle("/v1/public/config", s.rateLimit(http.HandlerFunc(s.publicConfig))).Methods(readMethods...)
	// Public like the config: a client reads the description before it
	// has a token.
	r.HandleFunc("/v1/openapi.json", s.openAPIDoc).Methods(readMethods...)

	// Signed blob URLs and service routes come before the /v1 user
	// subrouter, which matches the whole /v1 prefix.
	s.attachmentBlobRoutes(r)
	s.internalRoutes(r)
	s.realtimeRoutes(r)

	// Routes added to the subrouter are relative to /v1.
	user := r.PathPrefix("/v1").Subrouter()
	user.Use(s.authenticate(true))
	user.Use(s.deferDB0Failures) // before rateLimit: see DeferDB0Failure
	user.Use(s.rateLimit)
	user.HandleFunc("/me", s.me).Methods(readMethods...)
	user.HandleFunc("/dialogs", s.handle(s.createDialog)).Methods(http.MethodPost)
	user.HandleFunc("/dialogs", s.handle(s.listDialogs)).Methods(readMethods...)
	s.answersDB0Outage(user.HandleFunc("/dialogs/{id}/messages", s.handle(s.sendMessage)).Methods(http.MethodPost), limitWithReserve)
	user.HandleFunc("/dialogs/{id}/messages", s.handle(s.listMessages)).Methods(readMethods...)
	s.attachmentRoutes(user)
	s.realtimeUserRoutes(user)
	s.safetyRoutes(user)

	s.projectRoutes(r)
	s.router, s.v1 = r, user
}

// readMethods are the methods of a route that reads: HEAD wherever GET is
// served. net/http sends a HEAD answer's status and headers (the
// Content-Length of the body the GET would carry included) and drops its
// body, so the GET handler serves both; load balancers and uptime monitors
// probe with HEAD.
var readMethods = []string{http.MethodGet, http.MethodHead}

// FallbackRouteName names the web client's catch-all route (MountWeb); a
// path that only it matches is "not found" for other methods.
const FallbackRouteName = "fallback"

// apiRoots are the paths the service itself owns: on them and under them
// every answer, errors included, is JSON, and the web client never serves.
var apiRoots = []string{"/v1", "/projects", "/debug", "/metrics", "/healthz", "/readyz"}

// IsAPIPath reports whether path is one of the service's own roots or lies
// under one ("/v1", "/v1/…"; "/v1x" is not).
func IsAPIPath(path string) bool {
	for _, root := range apiRoots {
		if rest, ok := strings.CutPrefix(path, root); ok && (rest == "" || rest[0] == '/') {
			return true
		}
	}
	return false
}

// MountWeb serves h (the web client) for GET and HEAD on every path outside
// the API's roots. Registered last, it answers only what no API route
// matched; an unknown API path still gets the JSON 404/405.
func (s *Server) MountWeb(h http.Handler) {
	s.router.PathPrefix("/").Handler(h).Methods(readMethods...).
		MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool { return !IsAPIPath(r.URL.Path) }).
		Name(FallbackRouteName)
}

// canonicalPath answers 404 not_found, instead of the router's 301 to the
// canonical form, a request whose path has a doubled slash or a "." or ".."
// segment (plain or percent-encoded) when that form is an API path or the
// method is not GET or HEAD. HTTP clients follow a 301 of a POST, PUT or
// DELETE with a GET: a message sent to "//v1/dialogs/{id}/messages" (a
// base URL ending in "/" joined with "/v1/…") would become a read of the
// history, answered 200 with nothing stored. On the API's paths every
// answer is JSON and no URL has two spellings; the web client's pages keep
// the redirect of a GET.
func canonicalPath(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refusedSpelling(r) {
			writeError(w, errNotFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refusedSpelling reports whether canonicalPath answers r 404: its path is
// not in canonical form and that form is an API path, or its method is not
// GET or HEAD. cors asks it too, since it answers OPTIONS before
// canonicalPath runs.
func refusedSpelling(r *http.Request) bool {
	p := r.URL.Path
	c := cleanPath(p)
	return c != p && (IsAPIPath(c) || r.Method != http.MethodGet && r.Method != http.MethodHead)
}

// cleanPath is the canonical form the router redirects to: path.Clean,
// rooted, with a trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c
}

var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// notFound answers 405 with Allow when the path exists for other methods,
// else 404.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	allow := s.servedMethods(r)
	if len(allow) == 0 {
		writeError(w, errNotFound)
		return
	}
	MethodNotAllowed(w, allow...)
}

// servedMethods lists the methods other than r's own that an API route
// (not the web client's catch-all) serves on r's path.
func (s *Server) servedMethods(r *http.Request) []string {
	var allow []string
	// Matching reads the request and changes nothing in it: one shallow
	// copy serves every probe (a 404 flood costs no deep copies).
	probe := new(http.Request)
	*probe = *r
	for _, m := range probeMethods {
		if m == r.Method {
			continue
		}
		probe.Method = m
		var match mux.RouteMatch
		ok := s.router.Match(probe, &match)
		if ok && match.MatchErr == nil &&
			(match.Route == nil || match.Route.GetName() != FallbackRouteName) {
			allow = append(allow, m)
		}
	}
	return allow
}

// MethodNotAllowed answers 405 {"error":"method_not_allowed"} with Allow,
// for handlers mounted outside the router (the debug endpoints).
func MethodNotAllowed(w http.ResponseWriter, allow ...string) {
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, errMethodNotAllowed)
}

// UserRouter is the /v1 subrouter whose routes require a user token; paths
// added to it are relative to /v1 (later features add endpoints here).
func (s *Server) UserRouter() *mux.Router { return s.v1 }

// openAPIDoc serves docs/openapi.yaml as JSON.
func (s *Server) openAPIDoc(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=300")
	writeRawJSON(w, http.StatusOK, s.openapi)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeRawJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
}

type publicConfigDTO struct {
	RealtimeURL *string        `json:"realtimeUrl"`
	Limits      map[string]int `json:"limits"`
	Version     string         `json:"version"`
}

func (s *Server) publicConfig(w http.ResponseWriter, r *http.Request) {
	var realtime *string
	if u := s.cfg.PublicRealtimeURL; u != "" {
		realtime = &u
	} else if loopbackHost(r.Host) {
		scheme := "ws"
		if s.requestScheme(r) == "https" {
			scheme = "wss"
		}
		u = scheme + "://" + r.Host + "/v1/realtime"
		realtime = &u
	}
	// The answer depends on request headers: no shared cache may keep it.
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, publicConfigDTO{RealtimeURL: realtime, Version: Version, Limits: map[string]int{
		"messageBodyMaxChars": MaxMessageChars,
		"historyPageMax":      MaxPageLimit,
		"chatBodyMaxBytes":    ChatBodyLimit,
		"dialogMembersMax":    MaxDialogMembers,
		"dialogTitleMaxChars": MaxTitleChars,
	}})
}
