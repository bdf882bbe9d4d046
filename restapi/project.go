package restapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// The project Redis API's limits are package project's (limits.go); the
// snapshot reports every one of them.
const (
	projectPathPrefix       = "/projects/{projectId}/redis"
	defaultProjectKeyEnv    = "dev"
	projectMetricsNamespace = "han_project"
)

var (
	errProjectNotFound    = apiErr(http.StatusNotFound, "project_not_found")
	errUnsafeEviction     = apiErr(http.StatusServiceUnavailable, "unsafe_eviction_policy")
	errDataStateInvalid   = apiErr(http.StatusServiceUnavailable, "data_state_invalid")
	errInvalidSettings    = apiErr(http.StatusBadRequest, "invalid_settings")
	errCacheQuotaExceeded = apiErr(http.StatusConflict, "cache_quota_exceeded")
	errCacheKeyExists     = apiErr(http.StatusConflict, "cache_key_exists")
	errCacheKeyNotFound   = apiErr(http.StatusNotFound, "cache_key_not_found")
	errProjectMediaType   = apiErr(http.StatusUnsupportedMediaType, "unsupported_media_type")
	errInvalidCacheKey    = apiErr(http.StatusBadRequest, "invalid_cache_key")
	errInvalidCacheType   = apiErr(http.StatusBadRequest, "invalid_cache_type")
	errInvalidCacheValue  = apiErr(http.StatusBadRequest, "invalid_cache_value")
	errInvalidCacheTTL    = apiErr(http.StatusBadRequest, "invalid_cache_ttl")
	errCacheNoExpiry      = apiErr(http.StatusBadRequest, "cache_no_expiry_unsupported")
)

// projectAPI holds the collaborators of the project Redis API.
type projectAPI struct {
	env   string // HAN_ENV, part of every physical key
	cache *project.Cache
	gate  *project.EvictionGate
	queue *project.Queue // topics, subscriptions, claims, budgets (project_topics.go)
	// dataState counts requests refused because a project's structure was
	// found inconsistent.
	dataState prometheus.Counter
}

// projectRoutes mounts the project Redis API on the root router (not under
// /v1): user tokens only, the project body limit, the rate-limit seam.
func (s *Server) projectRoutes(r *mux.Router) {
	env := s.cfg.Env
	if env == "" {
		env = defaultProjectKeyEnv
	}
	s.prj = &projectAPI{env: env}
	if s.rdb != nil {
		s.prj.cache = project.NewCache(s.rdb)
		s.prj.gate = project.NewEvictionGate(s.rdb, s.cfg.EvictionPolicyTTL)
		s.prj.queue = s.newProjectQueue()
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: projectMetricsNamespace,
		Name: "data_state_invalid_total", Help: "Project API requests refused because the project's Redis structure is inconsistent."})
	if err := s.metrics.Registry.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			c = are.ExistingCollector.(prometheus.Counter)
		}
	}
	s.prj.dataState = c

	p := r.PathPrefix(projectPathPrefix).Subrouter()
	p.Use(s.authenticate(true))
	p.Use(s.rateLimit)
	p.HandleFunc("", s.projectByMethod(map[string]projectHandler{http.MethodGet: s.projectSnapshot}))
	p.HandleFunc("/", s.projectByMethod(map[string]projectHandler{http.MethodGet: s.projectSnapshot}))
	p.HandleFunc("/cache", s.projectByMethod(map[string]projectHandler{
		http.MethodGet: s.listCache, http.MethodPut: s.putCache, http.MethodDelete: s.deleteCache}))
	p.HandleFunc("/settings", s.projectByMethod(map[string]projectHandler{http.MethodPut: s.putProjectSettings}))
	s.projectQueueRoutes(p)
}

// projectHandler is a project route's handler: it writes its success and
// returns its failure, which projectFail answers.
type projectHandler func(http.ResponseWriter, *http.Request) error

// projectByMethod dispatches one path by method and answers 405 for the others.
// (gorilla/mux v1.8.1 loses a method mismatch inside a subrouter once a
// later route of it fails on the path, and answers 404 instead.)
func (s *Server) projectByMethod(hs map[string]projectHandler) http.HandlerFunc {
	allow := make([]string, 0, len(hs))
	for m := range hs {
		allow = append(allow, m)
	}
	slices.Sort(allow)
	allowed := strings.Join(allow, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		if h, ok := hs[r.Method]; ok {
			if err := h(w, r); err != nil {
				s.projectFail(w, r, err)
			}
			return
		}
		w.Header().Set("Allow", allowed)
		writeError(w, errMethodNotAllowed)
	}
}

var roleRank = map[string]int{store.RoleRead: 1, store.RoleWrite: 2, store.RoleAdmin: 3}

// projectReq is an authorised request on one project.
type projectReq struct {
	info store.ProjectInfo
	keys project.Keys
}

// projectAccess loads the project and the caller's role from PostgreSQL:
// an id that is not a UUID or names no project → 404 project_not_found; a
// non-member or a role below need → 403 forbidden.
func (s *Server) projectAccess(r *http.Request, need string) (projectReq, error) {
	id, ok := ids.Canonical(mux.Vars(r)["projectId"])
	if !ok {
		return projectReq{}, errProjectNotFound
	}
	info, err := s.store.ProjectAccess(r.Context(), id, principal(r).UserID)
	if errors.Is(err, store.ErrNotFound) {
		return projectReq{}, errProjectNotFound
	}
	if err != nil {
		return projectReq{}, err
	}
	if roleRank[info.Role] < roleRank[need] {
		return projectReq{}, errForbidden
	}
	if s.prj.cache == nil {
		return projectReq{}, errRedisUnavailable
	}
	return projectReq{info: info, keys: project.NewKeys(s.prj.env, id)}, nil
}

// projectMirror writes a project's mirrored metadata into Redis, for the
// store's writes that change both stores together.
func (s *Server) projectMirror(k project.Keys) store.MirrorFunc {
	return func(ctx context.Context, m project.Mirror) error {
		return s.prj.cache.SyncMeta(ctx, k, m)
	}
}

// projectFail counts data-state failures, then maps the error like every
// other failure.
func (s *Server) projectFail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, project.ErrDataStateInvalid) {
		s.prj.dataState.Inc()
	}
	if errors.Is(err, store.ErrMirrorRestore) {
		s.logger.LogAttrs(r.Context(), slog.LevelWarn, "project metadata mirror not restored after a failed commit; the next write repairs it",
			slog.String("request_id", requestID(r.Context())), slog.String("route", RouteTemplate(r)))
	}
	s.fail(w, r, err)
}

type permissionsDTO struct {
	Role  string `json:"role"`
	Read  bool   `json:"read"`
	Write bool   `json:"write"`
	Admin bool   `json:"admin"`
}

type cacheSummaryDTO struct {
	QuotaBytes int64 `json:"quotaBytes"`
	UsageBytes int64 `json:"usageBytes"`
	Entries    int64 `json:"entries"`
	// Legacy entries (saved "never expire" before the upgrade).
	LegacyEntries         int64  `json:"legacyEntries"`
	LegacyExpiresAt       *int64 `json:"legacyExpiresAt"`
	LegacyDeadlinePending bool   `json:"legacyDeadlinePending"`
}

type budgetDTO struct {
	LimitBytes       int64 `json:"limitBytes"`
	UsedBytes        int64 `json:"usedBytes"`
	ModuleLimitBytes int64 `json:"moduleLimitBytes"`
	// Topics and subscriptions: what usedBytes is made of, and the module counter.
	MessageBytes    int64 `json:"messageBytes"`
	ReceiptBytes    int64 `json:"receiptBytes"`
	DedupeBytes     int64 `json:"dedupeBytes"`
	ModuleUsedBytes int64 `json:"moduleUsedBytes"`
}

type runtimeDTO struct {
	EvictionPolicy string `json:"evictionPolicy"`
	WritesAllowed  bool   `json:"writesAllowed"`
	DeliveryPaused bool   `json:"deliveryPaused"`
}

type projectLimitsDTO struct {
	CacheKeyMaxBytes       int `json:"cacheKeyMaxBytes"`
	CacheTTLMinSeconds     int `json:"cacheTtlMinSeconds"`
	CacheTTLMaxSeconds     int `json:"cacheTtlMaxSeconds"`
	CacheTTLDefaultSeconds int `json:"cacheTtlDefaultSeconds"`
	CachePageDefault       int `json:"cachePageDefault"`
	CachePageMax           int `json:"cachePageMax"`
	CachePageValueBytes    int `json:"cachePageValueBytes"`
	CacheQuotaDefaultBytes int `json:"cacheQuotaDefaultBytes"`
	CacheQuotaMaxBytes     int `json:"cacheQuotaMaxBytes"`
	LegacyGraceSeconds     int `json:"legacyGraceSeconds"`
	BodyMaxBytes           int `json:"bodyMaxBytes"`
	MessageMaxBytes        int `json:"messageMaxBytes"`
	ResultMaxBytes         int `json:"resultMaxBytes"`
	ReceiptReserveBytes    int `json:"receiptReserveBytes"`
	ReceiptMaxAttempts     int `json:"receiptMaxAttempts"`
	ProjectBudgetBytes     int `json:"projectBudgetBytes"`
	ModuleBudgetBytes      int `json:"moduleBudgetBytes"`
	ClaimCountMin          int `json:"claimCountMin"`
	ClaimCountMax          int `json:"claimCountMax"`
	LeaseSeconds           int `json:"leaseSeconds"`
	PublishDedupeSeconds   int `json:"publishDedupeSeconds"`
	PageMax                int `json:"pageMax"`
}

var projectLimits = projectLimitsDTO{
	CacheKeyMaxBytes: project.CacheKeyMaxBytes, CacheTTLMinSeconds: project.CacheTTLMinSeconds, CacheTTLMaxSeconds: project.CacheTTLMaxSeconds,
	CacheTTLDefaultSeconds: project.CacheTTLDefaultSeconds, CachePageDefault: project.CachePageDefault, CachePageMax: project.CachePageMax,
	CachePageValueBytes: project.CachePageValueBytes, CacheQuotaDefaultBytes: project.CacheQuotaDefaultBytes,
	CacheQuotaMaxBytes: project.CacheQuotaMaxBytes, LegacyGraceSeconds: int(project.LegacyGrace / time.Second), BodyMaxBytes: ProjectBodyLimit,
	MessageMaxBytes: project.MessageMaxBytes, ResultMaxBytes: project.ResultMaxBytes,
	ReceiptReserveBytes: project.ReceiptReserveBytes, ReceiptMaxAttempts: project.ReceiptMaxAttempts,
	ProjectBudgetBytes: project.ProjectBudgetBytes, ModuleBudgetBytes: project.ModuleBudgetBytes,
	ClaimCountMin: project.ClaimCountMin, ClaimCountMax: project.ClaimCountMax, LeaseSeconds: int(project.LeaseDefault / time.Second),
	PublishDedupeSeconds: int(project.DedupeWindowDefault / time.Second), PageMax: project.CachePageMax,
}

// projectSnapshotDTO is GET /projects/{projectId}/redis.
type projectSnapshotDTO struct {
	ProjectID     string           `json:"projectId"`
	Permissions   permissionsDTO   `json:"permissions"`
	Cache         cacheSummaryDTO  `json:"cache"`
	Topics        []any            `json:"topics"`
	Subscriptions []any            `json:"subscriptions"`
	Budget        budgetDTO        `json:"budget"`
	Runtime       runtimeDTO       `json:"runtime"`
	Limits        projectLimitsDTO `json:"limits"`
}

func (s *Server) projectSnapshot(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleRead)
	if err != nil {
		return err
	}
	ctx := r.Context()
	st, err := s.prj.cache.State(ctx, pr.keys)
	if err != nil {
		return err
	}
	policy, err := s.prj.gate.Policy(ctx)
	if err != nil {
		return err
	}
	m := pr.info.Mirror()
	rank := roleRank[pr.info.Role]
	dto := projectSnapshotDTO{
		ProjectID:   pr.info.ID,
		Permissions: permissionsDTO{Role: pr.info.Role, Read: rank >= 1, Write: rank >= 2, Admin: rank >= 3},
		Cache:       cacheSummaryDTO{QuotaBytes: m.CacheQuotaBytes, UsageBytes: st.UsageBytes, Entries: st.Entries},
		Topics:      []any{}, Subscriptions: []any{},
		Budget:  budgetDTO{LimitBytes: project.ProjectBudgetBytes, ModuleLimitBytes: project.ModuleBudgetBytes},
		Runtime: runtimeDTO{EvictionPolicy: policy, WritesAllowed: project.WritesAllowedUnder(policy), DeliveryPaused: m.DeliveryPaused},
		Limits:  projectLimits,
	}
	if lv := st.Legacy(m); lv.Entries > 0 {
		dto.Cache.LegacyEntries, dto.Cache.LegacyExpiresAt, dto.Cache.LegacyDeadlinePending = lv.Entries, &lv.ExpiresAt, lv.Pending
	}
	if err := s.snapshotReliable(ctx, pr, &dto); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, dto)
	return nil
}

// snapshotReliable fills topics, subscriptions and the budget
// (project_topics.go).
func (s *Server) snapshotReliable(ctx context.Context, pr projectReq, dto *projectSnapshotDTO) error {
	return s.snapshotQueue(ctx, pr, dto)
}

type settingsDTO struct {
	CacheQuotaBytes int64 `json:"cacheQuotaBytes"`
	DeliveryPaused  bool  `json:"deliveryPaused"`
}

// putProjectSettings: exactly one of cacheQuotaBytes (admin; a positive
// integer ≤ 16 MiB) or deliveryPaused (write; a boolean).
func (s *Server) putProjectSettings(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleWrite)
	if err != nil {
		return err
	}
	set, err := s.readSettings(w, r, pr)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	// An inconsistent structure refuses the request before PostgreSQL
	// changes (the mirror could not follow).
	if _, err := s.prj.cache.State(ctx, pr.keys); err != nil {
		return err
	}
	// The Redis mirror is written inside the PostgreSQL transaction, which
	// commits only once it succeeded: a refused mirror write (OOM, outage)
	// changes neither store, so the 503 means "not applied".
	info, err := s.store.UpdateProjectSettings(ctx, pr.info.ID, set, s.projectMirror(pr.keys))
	if errors.Is(err, store.ErrNotFound) {
		err = errProjectNotFound
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, settingsDTO{CacheQuotaBytes: info.CacheQuotaBytes, DeliveryPaused: info.DeliveryPaused})
	return nil
}

func (s *Server) readSettings(w http.ResponseWriter, r *http.Request, pr projectReq) (store.ProjectSettings, error) {
	var set store.ProjectSettings
	b, err := readProjectBody(w, r)
	if err != nil {
		return set, err
	}
	members, err := jsonx.TopLevel(b)
	if err != nil {
		if projectFieldProblem(err, len(b)) == "cacheQuotaBytes" || projectFieldProblem(err, len(b)) == "deliveryPaused" {
			return set, errInvalidSettings
		}
		return set, errInvalidJSON
	}
	q, hasQ := members["cacheQuotaBytes"]
	d, hasD := members["deliveryPaused"]
	switch {
	case hasQ == hasD:
		return set, errInvalidSettings
	case hasQ:
		if roleRank[pr.info.Role] < roleRank[store.RoleAdmin] {
			return set, errForbidden
		}
		n, ok := projectPositiveInt(q, project.CacheQuotaMaxBytes)
		if !ok {
			return set, errInvalidSettings
		}
		set.CacheQuotaBytes = &n
	default:
		var v bool
		switch string(d) {
		case "true":
			v = true
		case "false":
		default:
			return set, errInvalidSettings
		}
		set.DeliveryPaused = &v
	}
	return set, nil
}

// readProjectBody reads a JSON body under the project limit (16 MiB +
// 64 KiB, enforced while reading).
func readProjectBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !projectJSONContentType(ct) {
		return nil, errProjectMediaType
	}
	return readBody(w, r, ProjectBodyLimit)
}

func projectJSONContentType(ct string) bool {
	return strings.HasPrefix(strings.ToLower(ct), "application/json")
}

// projectFieldProblem names the top-level member a jsonx refusal lies in, or ""
// when the problem is not inside one member's value (between members, in
// the structure, or a body cut short): then the body as a whole is
// malformed and the answer is invalid_json (docs/project-redis-api.md).
func projectFieldProblem(err error, n int) string {
	je, ok := errors.AsType[*jsonx.Error](err)
	if !ok || len(je.Path) == 0 || (je.Reason == jsonx.ReasonSyntax && je.Offset >= n) {
		return ""
	}
	return je.Path[0]
}

// projectPositiveInt accepts a raw JSON number token written as a plain
// positive integer (no sign, fraction or exponent) not above max.
func projectPositiveInt(raw []byte, max int64) (int64, bool) {
	if len(raw) == 0 || len(raw) > 19 || raw[0] == '0' {
		return 0, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 1 || n > max {
		return 0, false
	}
	return n, true
}
