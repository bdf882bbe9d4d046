package projectapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

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

// limitsDTO reports every limit of the API; they are package project's
// (limits.go), the body limit the server's (bodyMaxBytes: cache PUT and
// publish; smallBodyMaxBytes: every other route with a body).
type limitsDTO struct {
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
	SmallBodyMaxBytes      int `json:"smallBodyMaxBytes"`
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

func newLimits(bodyLimit int64) limitsDTO {
	return limitsDTO{
		CacheKeyMaxBytes: project.CacheKeyMaxBytes, CacheTTLMinSeconds: project.CacheTTLMinSeconds, CacheTTLMaxSeconds: project.CacheTTLMaxSeconds,
		CacheTTLDefaultSeconds: project.CacheTTLDefaultSeconds, CachePageDefault: project.CachePageDefault, CachePageMax: project.CachePageMax,
		CachePageValueBytes: project.CachePageValueBytes, CacheQuotaDefaultBytes: project.CacheQuotaDefaultBytes,
		CacheQuotaMaxBytes: project.CacheQuotaMaxBytes, LegacyGraceSeconds: int(project.LegacyGrace / time.Second), BodyMaxBytes: int(bodyLimit),
		SmallBodyMaxBytes: int(min(bodyLimit, SmallBodyLimit)), MessageMaxBytes: project.MessageMaxBytes, ResultMaxBytes: project.ResultMaxBytes,
		ReceiptReserveBytes: project.ReceiptReserveBytes, ReceiptMaxAttempts: project.ReceiptMaxAttempts,
		ProjectBudgetBytes: project.ProjectBudgetBytes, ModuleBudgetBytes: project.ModuleBudgetBytes,
		ClaimCountMin: project.ClaimCountMin, ClaimCountMax: project.ClaimCountMax, LeaseSeconds: int(project.LeaseDefault / time.Second),
		PublishDedupeSeconds: int(project.DedupeWindowDefault / time.Second), PageMax: project.CachePageMax,
	}
}

// snapshotDTO is GET /projects/{projectId}/redis.
type snapshotDTO struct {
	ProjectID     string            `json:"projectId"`
	Permissions   permissionsDTO    `json:"permissions"`
	Cache         cacheSummaryDTO   `json:"cache"`
	Topics        []topicDTO        `json:"topics"`
	Subscriptions []subscriptionDTO `json:"subscriptions"`
	Budget        budgetDTO         `json:"budget"`
	Runtime       runtimeDTO        `json:"runtime"`
	Limits        limitsDTO         `json:"limits"`
}

var snapshotRoute = route[struct{}]{spec: wholeProject.with(store.RoleRead, noBody, nil), do: (*API).snapshot}

func (a *API) snapshot(ctx context.Context, c *call, _ struct{}) (reply, error) {
	st, err := a.cache.State(ctx, c.keys)
	if err != nil {
		return reply{}, err
	}
	policy, err := a.gate.Policy(ctx)
	if err != nil {
		return reply{}, err
	}
	m := c.info.Mirror()
	rank := roleRank[c.info.Role]
	dto := snapshotDTO{
		ProjectID:   c.info.ID,
		Permissions: permissionsDTO{Role: c.info.Role, Read: rank >= 1, Write: rank >= 2, Admin: rank >= 3},
		Cache:       cacheSummaryDTO{QuotaBytes: m.CacheQuotaBytes, UsageBytes: st.UsageBytes, Entries: st.Entries},
		Runtime:     runtimeDTO{EvictionPolicy: policy, WritesAllowed: project.WritesAllowedUnder(policy), DeliveryPaused: m.DeliveryPaused},
		Limits:      a.limits,
	}
	if lv := st.Legacy(m); lv.Entries > 0 {
		dto.Cache.LegacyEntries, dto.Cache.LegacyExpiresAt, dto.Cache.LegacyDeadlinePending = lv.Entries, &lv.ExpiresAt, lv.Pending
	}
	if err := a.snapshotQueue(ctx, c.keys, &dto); err != nil {
		return reply{}, err
	}
	return reply{status: http.StatusOK, body: dto}, nil
}

// snapshotQueue fills the snapshot's topics, subscriptions and budget, and
// the limits the queue's configuration sets.
func (a *API) snapshotQueue(ctx context.Context, k project.Keys, dto *snapshotDTO) error {
	q := a.queue
	st, err := q.State(ctx, k)
	if err != nil {
		return err
	}
	mod, err := q.Module().Usage(ctx)
	if err != nil {
		return err
	}
	dto.Topics = make([]topicDTO, 0, len(st.Topics))
	for _, t := range st.Topics {
		dto.Topics = append(dto.Topics, topicDTO(t))
	}
	dto.Subscriptions = make([]subscriptionDTO, 0, len(st.Subscriptions))
	for _, sub := range st.Subscriptions {
		dto.Subscriptions = append(dto.Subscriptions, subscriptionDTO(sub))
	}
	cfg := q.Config()
	dto.Budget = budgetDTO{LimitBytes: cfg.ProjectBudgetBytes, UsedBytes: st.UsedBytes(), ModuleLimitBytes: q.Module().Cap(),
		MessageBytes: st.MessageBytes, ReceiptBytes: st.ReceiptBytes, DedupeBytes: st.DedupeBytes,
		ModuleUsedBytes: mod.Committed + mod.Reserved}
	dto.Limits.ProjectBudgetBytes = int(cfg.ProjectBudgetBytes)
	dto.Limits.ModuleBudgetBytes = int(q.Module().Cap())
	dto.Limits.LeaseSeconds = int(cfg.Lease / time.Second)
	dto.Limits.PublishDedupeSeconds = int(cfg.DedupeWindow / time.Second)
	return nil
}

type settingsDTO struct {
	CacheQuotaBytes int64 `json:"cacheQuotaBytes"`
	DeliveryPaused  bool  `json:"deliveryPaused"`
}

// settingsRoute: exactly one of cacheQuotaBytes (admin; a positive integer
// ≤ 16 MiB) or deliveryPaused (write; a boolean).
var settingsRoute = route[store.ProjectSettings]{
	spec: wholeProject.with(store.RoleWrite, objectBody,
		fieldCodes{"cacheQuotaBytes": errInvalidSettings, "deliveryPaused": errInvalidSettings}),
	parse: parseSettings, do: (*API).putSettings,
}

func parseSettings(c *call) (store.ProjectSettings, error) {
	var set store.ProjectSettings
	q, hasQ := c.body["cacheQuotaBytes"]
	d, hasD := c.body["deliveryPaused"]
	switch {
	case hasQ == hasD:
		return set, errInvalidSettings
	case hasQ:
		if roleRank[c.info.Role] < roleRank[store.RoleAdmin] {
			return set, apierr.Forbidden
		}
		n, ok := positiveInt(q, project.CacheQuotaMaxBytes)
		if !ok {
			return set, errInvalidSettings
		}
		set.CacheQuotaBytes = &n
	default:
		v, ok := boolToken(d)
		if !ok {
			return set, errInvalidSettings
		}
		set.DeliveryPaused = &v
	}
	return set, nil
}

func (a *API) putSettings(ctx context.Context, c *call, set store.ProjectSettings) (reply, error) {
	// An inconsistent structure refuses the request before PostgreSQL
	// changes (the mirror could not follow).
	if _, err := a.cache.State(ctx, c.keys); err != nil {
		return reply{}, err
	}
	// The Redis mirror is written inside the PostgreSQL transaction, which
	// commits only once it succeeded: a refused mirror write (OOM, outage)
	// changes neither store, so the 503 means "not applied".
	info, err := a.d.Store.UpdateProjectSettings(ctx, c.info.ID, set, a.mirror(c.keys))
	if errors.Is(err, store.ErrNotFound) {
		err = ErrProjectNotFound
	}
	if err != nil {
		return reply{}, err
	}
	return reply{status: http.StatusOK, body: settingsDTO{CacheQuotaBytes: info.CacheQuotaBytes, DeliveryPaused: info.DeliveryPaused}}, nil
}
