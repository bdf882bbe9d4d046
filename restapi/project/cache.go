package projectapi

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// cacheItemDTO is a cache item (docs/project-redis-api.md). updatedAt is
// null for legacy entries, whose write time is unknown.
type cacheItemDTO struct {
	Key                   string `json:"key"`
	Type                  string `json:"type"`
	Value                 string `json:"value"`
	SizeBytes             int64  `json:"sizeBytes"`
	ExpiresAt             int64  `json:"expiresAt"`
	UpdatedAt             *int64 `json:"updatedAt"`
	LegacyNoExpiry        bool   `json:"legacyNoExpiry,omitempty"`
	LegacyDeadlinePending bool   `json:"legacyDeadlinePending,omitempty"`
}

func toCacheItemDTO(it project.CacheItem) cacheItemDTO {
	d := cacheItemDTO{Key: it.Key, Type: it.Type, Value: it.Value, SizeBytes: it.SizeBytes, ExpiresAt: it.ExpiresAt,
		LegacyNoExpiry: it.LegacyNoExpiry, LegacyDeadlinePending: it.LegacyDeadlinePending}
	if !it.LegacyNoExpiry {
		u := it.UpdatedAt
		d.UpdatedAt = &u
	}
	return d
}

// parseCacheTTL applies the TTL rules to the raw token of ttlSeconds:
// absent → 86400 s; null → cache_no_expiry_unsupported; only a plain
// positive integer (no sign, fraction or exponent, so 1.0 and 1e3 are
// refused too) in 1..2592000 is accepted, anything else (0, negatives,
// 1.5, 1e400, strings, booleans, objects, arrays) → invalid_cache_ttl.
func parseCacheTTL(raw []byte, present bool) (time.Duration, error) {
	if !present {
		return project.CacheTTLDefaultSeconds * time.Second, nil
	}
	if string(raw) == "null" {
		return 0, errCacheNoExpiry
	}
	n, ok := positiveInt(raw, project.CacheTTLMaxSeconds)
	if !ok {
		return 0, errInvalidCacheTTL
	}
	return time.Duration(n) * time.Second, nil
}

// cacheFields are the cache PUT's fields with a code of their own.
var cacheFields = fieldCodes{
	"key":        errInvalidCacheKey,
	"type":       errInvalidCacheType,
	"value":      errInvalidCacheValue,
	"ttlSeconds": errInvalidCacheTTL,
}

// parseCachePut validates a PUT /cache body's members completely before
// anything is written (the raw-body checks ran in members): key, type,
// value, ttlSeconds and createOnly in that order.
func parseCachePut(m map[string]json.RawMessage) (project.CachePut, error) {
	var p project.CachePut
	var ok bool
	if p.Key, ok = stringToken(m["key"]); !ok || !project.ValidCacheKey(p.Key) {
		return p, errInvalidCacheKey
	}
	if p.Type, ok = stringToken(m["type"]); !ok || (p.Type != "json" && p.Type != "string") {
		return p, errInvalidCacheType
	}
	if p.Value, ok = stringToken(m["value"]); !ok {
		return p, errInvalidCacheValue
	}
	if p.Type == "json" && jsonx.Check([]byte(p.Value)) != nil {
		return p, errInvalidCacheValue
	}
	ttl, present := m["ttlSeconds"]
	var err error
	if p.TTL, err = parseCacheTTL(ttl, present); err != nil {
		return p, err
	}
	if co, present := m["createOnly"]; present {
		if p.CreateOnly, ok = boolToken(co); !ok {
			return p, apierr.InvalidJSON
		}
	}
	return p, nil
}

var cachePutRoute = route[project.CachePut]{
	spec:  wholeProject.with(store.RoleWrite, objectBody, cacheFields).large(),
	parse: func(c *call) (project.CachePut, error) { return parseCachePut(c.body) },
	do:    (*API).putCache,
}

func (a *API) putCache(ctx context.Context, c *call, put project.CachePut) (reply, error) {
	if project.CacheItemSize(put.Key, put.Value) > c.info.CacheQuotaBytes {
		return reply{}, errCacheQuotaExceeded
	}
	m := c.info.Mirror()
	if m.LegacyDeadlineMs == 0 {
		// The next PUT in the project fixes the legacy deadline in
		// PostgreSQL (the truth) and its Redis mirror together.
		exists, candidate, err := a.cache.LegacyDeadlineCandidate(ctx, c.keys)
		if err != nil {
			return reply{}, err
		}
		if exists {
			if m.LegacyDeadlineMs, err = a.d.Store.FixLegacyDeadline(ctx, c.info.ID, candidate, a.mirror(c.keys)); err != nil {
				return reply{}, err
			}
		}
	}
	res, err := a.cache.Put(ctx, c.keys, m, put)
	if res.MirrorDiffers {
		a.repairMirror(ctx, c)
	}
	switch {
	case errors.Is(err, project.ErrCacheQuotaExceeded):
		return reply{}, errCacheQuotaExceeded
	case errors.Is(err, project.ErrCacheKeyExists):
		return reply{}, ErrCacheKeyExists
	case err != nil:
		return reply{}, err
	}
	status := http.StatusOK
	if res.Created {
		status = http.StatusCreated
	}
	return reply{status: status, body: toCacheItemDTO(res.Item)}, nil
}

// repairMirror runs when the put script found the Redis mirror holding
// other values than this request read from PostgreSQL: either a settings
// change landed in between (the mirror is right), or the mirror is stale (a
// change that failed and whose repair failed too, a restored dump), and a
// cache write no longer overwrites it, since it cannot tell which. Rewriting
// the mirror from PostgreSQL's row, under its lock, keeps the first and
// repairs the second, so the next PUT is judged by the quota in force.
// Best effort: a failure is logged and the answer stands.
func (a *API) repairMirror(ctx context.Context, c *call) {
	if err := a.d.Store.RemirrorProject(ctx, c.info.ID, a.mirror(c.keys)); err != nil {
		a.d.Logger.LogAttrs(ctx, slog.LevelWarn, "project metadata mirror not repaired after a cache write found it differing",
			slog.String("request_id", a.d.Host.RequestID(ctx)), slog.String("kind", store.Kind(err)))
	}
}

var cacheDeleteRoute = route[string]{
	spec:  wholeProject.with(store.RoleWrite, noBody, nil),
	parse: parseCacheKeyParam, do: (*API).deleteCache,
}

// parseCacheKeyParam: exactly one valid ?key=.
func parseCacheKeyParam(c *call) (string, error) {
	keys := c.r.URL.Query()["key"]
	if len(keys) != 1 || !project.ValidCacheKey(keys[0]) {
		return "", errInvalidCacheKey
	}
	return keys[0], nil
}

func (a *API) deleteCache(ctx context.Context, c *call, key string) (reply, error) {
	err := a.cache.Delete(ctx, c.keys, c.info.Mirror(), key)
	if errors.Is(err, project.ErrCacheKeyNotFound) {
		err = ErrCacheKeyNotFound
	}
	return reply{status: http.StatusNoContent, noStore: true}, err
}

var cacheListRoute = route[project.CacheQuery]{spec: wholeProject.with(store.RoleRead, noBody, nil), parse: parseCacheQuery, do: (*API).listCache}

func parseCacheQuery(c *call) (project.CacheQuery, error) {
	q := c.r.URL.Query()
	cq := project.CacheQuery{Search: q.Get("search"), Prefix: q.Get("prefix"), MaxValueBytes: project.CachePageValueBytes}
	var err error
	if cq.Limit, err = c.limit(project.CachePageDefault, project.CachePageMax); err != nil {
		return cq, err
	}
	cursor, err := c.cursor()
	if err != nil {
		return cq, err
	}
	cq.Cursor, err = project.ParseCacheCursor(cursor)
	return cq, err
}

// listCache streams one page: the plan (structure checks, which items,
// legacy values) happens before the status line, so every refusal is a
// proper error; normal values are then read in pipelined batches and
// written as they arrive, so a page of up to 4 MiB of values is never
// encoded as one buffer.
func (a *API) listCache(ctx context.Context, c *call, cq project.CacheQuery) (reply, error) {
	m := c.info.Mirror()
	page, err := a.cache.PlanPage(ctx, c.keys, m, cq)
	if err != nil {
		return reply{}, err
	}
	return reply{noStore: true, stream: func(w http.ResponseWriter) {
		a.streamCachePage(ctx, w, c, page)
		// Lazy cleanup of what the listing found expired or evicted; best
		// effort (refused under OOM, where the listing itself still works).
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := a.cache.PruneAfter(pctx, c.keys, m, page); err != nil {
			a.d.DependencyErrors.WithLabelValues("redis", "project_cache_prune").Inc()
		}
	}}, nil
}

// streamCachePage writes {"items":[…],"nextCursor":…} item by item. The
// status line waits for the first item (or the end), so a Redis failure
// before any item is answered as an error; one after cuts the response.
func (a *API) streamCachePage(ctx context.Context, w http.ResponseWriter, c *call, page *project.CachePage) {
	bw := bufio.NewWriterSize(w, 64<<10)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = bw.WriteString(`{"items":[`)
		}
	}
	n := 0
	var writeErr error // the client's side: a write that failed
	err := a.cache.EachItem(ctx, c.keys, page, func(it project.CacheItem) error {
		b, err := json.Marshal(toCacheItemDTO(it))
		if err != nil {
			return err
		}
		start()
		if n > 0 {
			_ = bw.WriteByte(',')
		}
		n++
		if _, writeErr = bw.Write(b); writeErr != nil {
			return writeErr
		}
		return nil
	})
	switch {
	case err == nil:
	case writeErr != nil || ctx.Err() != nil:
		// The client stopped reading or left: not a failure of Redis.
		panic(http.ErrAbortHandler)
	case !started:
		a.d.Host.Fail(w, c.r, err) // counted and logged there, like any refusal
		return
	default:
		// Half a page is already on the wire: cut the response so the
		// client sees a failure instead of a short, valid-looking page.
		a.d.DependencyErrors.WithLabelValues("redis", "project_cache_list").Inc()
		a.d.Logger.LogAttrs(ctx, slog.LevelWarn, "project cache listing aborted",
			slog.String("request_id", a.d.Host.RequestID(ctx)), slog.String("kind", store.Kind(err)))
		panic(http.ErrAbortHandler)
	}
	start()
	_, _ = bw.WriteString(`],"nextCursor":`)
	if page.Next == "" {
		_, _ = bw.WriteString("null}")
	} else {
		nb, _ := json.Marshal(page.Next)
		_, _ = bw.Write(nb)
		_ = bw.WriteByte('}')
	}
	_ = bw.Flush()
}
