package projectapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// PathPrefix is where the API is mounted on the root router (not under /v1).
const PathPrefix = "/projects/{projectId}/redis"

const (
	defaultKeyEnv    = "dev"
	metricsNamespace = "han_project"
)

// Store is the PostgreSQL side of a project (package store): membership
// and settings, which are the truth, and the writes that keep their Redis
// mirror inside the same transaction.
type Store interface {
	ProjectAccess(ctx context.Context, projectID, userID string) (store.ProjectInfo, error)
	UpdateProjectSettings(ctx context.Context, projectID string, set store.ProjectSettings, mirror store.MirrorFunc) (store.ProjectInfo, error)
	FixLegacyDeadline(ctx context.Context, projectID string, candidateMs int64, mirror store.MirrorFunc) (int64, error)
	RemirrorProject(ctx context.Context, projectID string, mirror store.MirrorFunc) error
}

// Host is what the API server lends the handlers: its body reader (limit
// enforced while reading), its JSON writer, its page-limit parser, its one
// error writer, and the request id and route template its logs carry.
type Host interface {
	ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error)
	WriteJSON(w http.ResponseWriter, status int, v any)
	ParseLimit(r *http.Request, def, max int) (int, error)
	// Fail answers err: an *apierr.Error as it is, a domain error through
	// the server's error table.
	Fail(w http.ResponseWriter, r *http.Request, err error)
	RequestID(ctx context.Context) string
	Route(r *http.Request) string
}

// Deps are the collaborators of the project Redis API.
type Deps struct {
	Host  Host
	Store Store
	// Redis is DB0; nil: every route answers redis_unavailable once the
	// caller's access is checked.
	Redis  redis.UniversalClient
	Logger *slog.Logger
	// Env is HAN_ENV, part of every physical key; "" means "dev".
	Env string
	// EvictionPolicyTTL is how long Redis's maxmemory-policy is cached.
	EvictionPolicyTTL time.Duration
	Queue             project.QueueConfig // zero values mean the defaults
	// BodyLimit caps a request body (413 payload_too_large past it).
	BodyLimit int64
	// Authenticate and RateLimit are the server's middleware, run in
	// this order before every route.
	Authenticate, RateLimit mux.MiddlewareFunc
	// Registry takes the API's own metrics; DependencyErrors is the
	// server's han_dependency_errors_total.
	Registry         prometheus.Registerer
	DependencyErrors *prometheus.CounterVec
}

// API is the project Redis API. Safe for concurrent use.
type API struct {
	d     Deps
	env   string
	cache *project.Cache
	gate  *project.EvictionGate
	queue *project.Queue
	// dataState counts requests refused because a project's structure was
	// found inconsistent.
	dataState prometheus.Counter
	limits    limitsDTO
}

// New builds the API and registers its metrics.
func New(d Deps) *API {
	a := &API{d: d, env: d.Env}
	if a.env == "" {
		a.env = defaultKeyEnv
	}
	if d.Redis != nil {
		a.cache = project.NewCache(d.Redis)
		a.gate = project.NewEvictionGate(d.Redis, d.EvictionPolicyTTL)
		a.queue = a.newQueue()
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricsNamespace,
		Name: "data_state_invalid_total", Help: "Project API requests refused because the project's Redis structure is inconsistent."})
	if err := d.Registry.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			c = are.ExistingCollector.(prometheus.Counter)
		}
	}
	a.dataState = c
	a.limits = newLimits(d.BodyLimit)
	return a
}

// newQueue builds the Redis side of topics and subscriptions and its
// metrics.
func (a *API) newQueue() *project.Queue {
	c := a.d.Queue
	q := project.NewQueue(a.d.Redis, project.NewModuleBudget(a.d.Redis, a.env, c.ModuleCap()), c)
	f := prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: metricsNamespace, Name: "module_budget_settle_failures_total",
		Help: "Module budget settlements that failed (the module counter over-counts until the next reconcile)."},
		func() float64 { return float64(q.SettleFailures()) })
	_ = a.d.Registry.Register(f)
	return q
}

// Mount adds every route of the API under PathPrefix on r: user tokens
// only, then the rate-limit seam.
func (a *API) Mount(r *mux.Router) {
	p := r.PathPrefix(PathPrefix).Subrouter()
	p.Use(a.d.Authenticate)
	p.Use(a.d.RateLimit)
	snapshot := a.byMethod(methods{http.MethodGet: serve(a, snapshotRoute)})
	p.HandleFunc("", snapshot)
	p.HandleFunc("/", snapshot)
	p.HandleFunc("/settings", a.byMethod(methods{http.MethodPut: serve(a, settingsRoute)}))
	p.HandleFunc("/cache", a.byMethod(methods{http.MethodGet: serve(a, cacheListRoute),
		http.MethodPut: serve(a, cachePutRoute), http.MethodDelete: serve(a, cacheDeleteRoute)}))
	p.HandleFunc("/topics", a.byMethod(methods{http.MethodPost: serve(a, topicCreateRoute)}))
	p.HandleFunc("/topics/{topicId}", a.byMethod(methods{http.MethodDelete: serve(a, topicDeleteRoute)}))
	p.HandleFunc("/topics/{topicId}/messages", a.byMethod(methods{http.MethodGet: serve(a, messageListRoute),
		http.MethodPost: serve(a, publishRoute)}))
	p.HandleFunc("/topics/{topicId}/trim", a.byMethod(methods{http.MethodPost: serve(a, trimRoute)}))
	p.HandleFunc("/subscriptions", a.byMethod(methods{http.MethodPost: serve(a, subCreateRoute)}))
	p.HandleFunc("/subscriptions/{subscriptionId}", a.byMethod(methods{http.MethodPatch: serve(a, subPatchRoute),
		http.MethodDelete: serve(a, subDeleteRoute)}))
	p.HandleFunc("/subscriptions/{subscriptionId}/receipts", a.byMethod(methods{http.MethodGet: serve(a, receiptListRoute),
		http.MethodPost: serve(a, receiptPostRoute)}))
	p.HandleFunc("/subscriptions/{subscriptionId}/claim", a.byMethod(methods{http.MethodPost: serve(a, claimRoute)}))
}

// handler is a route's handler: it writes its success and returns its
// failure, which fail answers.
type handler func(http.ResponseWriter, *http.Request) error

type methods map[string]handler

// byMethod dispatches one path by method and answers 405 with Allow for
// the others; a path served for GET is served for HEAD by the same handler
// (net/http drops the body of a HEAD answer). (gorilla/mux v1.8.1 loses a
// method mismatch inside a subrouter once a later route of it fails on the
// path, and answers 404 instead.)
func (a *API) byMethod(hs methods) http.HandlerFunc {
	if get, ok := hs[http.MethodGet]; ok {
		hs[http.MethodHead] = get
	}
	allow := make([]string, 0, len(hs))
	for m := range hs {
		allow = append(allow, m)
	}
	slices.Sort(allow)
	allowed := strings.Join(allow, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		h, ok := hs[r.Method]
		if !ok {
			w.Header().Set("Allow", allowed)
			a.d.Host.Fail(w, r, apierr.MethodNotAllowed)
			return
		}
		if err := h(w, r); err != nil {
			a.fail(w, r, err)
		}
	}
}

// fail counts data-state failures and logs a mirror left unrestored, then
// hands the error to the server's one error writer.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, project.ErrDataStateInvalid) {
		a.dataState.Inc()
	}
	if errors.Is(err, store.ErrMirrorRestore) {
		a.d.Logger.LogAttrs(r.Context(), slog.LevelWarn, "project metadata mirror not restored after a failed commit; the next cache PUT or settings change repairs it",
			slog.String("request_id", a.d.Host.RequestID(r.Context())), slog.String("route", a.d.Host.Route(r)))
	}
	a.d.Host.Fail(w, r, err)
}

var roleRank = map[string]int{store.RoleRead: 1, store.RoleWrite: 2, store.RoleAdmin: 3}

// access is an authorised request on one project.
type access struct {
	info store.ProjectInfo
	keys project.Keys
}

// access loads the project and the caller's role from PostgreSQL: an id
// that is not a UUID or names no project → 404 project_not_found; a
// non-member or a role below need → 403 forbidden.
func (a *API) access(r *http.Request, need string) (access, error) {
	id, ok := ids.Canonical(mux.Vars(r)["projectId"])
	if !ok {
		return access{}, ErrProjectNotFound
	}
	p, _ := auth.PrincipalFrom(r.Context())
	info, err := a.d.Store.ProjectAccess(r.Context(), id, p.UserID)
	if errors.Is(err, store.ErrNotFound) {
		return access{}, ErrProjectNotFound
	}
	if err != nil {
		return access{}, err
	}
	if roleRank[info.Role] < roleRank[need] {
		return access{}, apierr.Forbidden
	}
	if a.cache == nil {
		return access{}, apierr.RedisUnavailable
	}
	return access{info: info, keys: project.NewKeys(a.env, id)}, nil
}

// mirror writes a project's mirrored metadata into Redis, for the store's
// writes that change both stores together.
func (a *API) mirror(k project.Keys) store.MirrorFunc {
	return func(ctx context.Context, m project.Mirror) error {
		return a.cache.SyncMeta(ctx, k, m)
	}
}
