package restapi

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// cacheItemDTO is a cache item (docs/project-redis-api.md). updatedAt is null for legacy
// entries, whose write time is unknown.
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

// parseCacheTTL applies the TTL rules to the raw token of
// ttlSeconds: absent → 86400 s; null → cache_no_expiry_unsupported; only a
// plain positive integer (no sign, fraction or exponent, so 1.0 and 1e3 are
// refused too) in 1..2592000 is accepted, anything else (0, negatives,
// 1.5, 1e400, strings, booleans, objects, arrays) → invalid_cache_ttl.
func parseCacheTTL(raw []byte, present bool) (time.Duration, error) {
	if !present {
		return project.CacheTTLDefaultSeconds * time.Second, nil
	}
	if string(raw) == "null" {
		return 0, errCacheNoExpiry
	}
	n, ok := projectPositiveInt(raw, project.CacheTTLMaxSeconds)
	if !ok {
		return 0, errInvalidCacheTTL
	}
	return time.Duration(n) * time.Second, nil
}

// cacheFieldErrors are the field-specific codes that take precedence over
// invalid_json for a problem inside that field, so a client learns which
// field is wrong.
var cacheFieldErrors = map[string]*Error{
	"key":        errInvalidCacheKey,
	"type":       errInvalidCacheType,
	"value":      errInvalidCacheValue,
	"ttlSeconds": errInvalidCacheTTL,
}

// projectStringToken decodes a raw JSON string token (already checked by jsonx:
// valid UTF-8, no lone surrogates); ok is false for any other token.
func projectStringToken(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// parseCachePut validates a PUT /cache body completely before anything is
// written: raw-body checks first (jsonx), then key, type, value, ttlSeconds
// and createOnly in that order.
func parseCachePut(b []byte) (project.CachePut, error) {
	var p project.CachePut
	members, err := jsonx.TopLevel(b)
	if err != nil {
		if e, ok := cacheFieldErrors[projectFieldProblem(err, len(b))]; ok {
			return p, e
		}
		return p, errInvalidJSON
	}
	var ok bool
	if p.Key, ok = projectStringToken(members["key"]); !ok || !project.ValidCacheKey(p.Key) {
		return p, errInvalidCacheKey
	}
	if p.Type, ok = projectStringToken(members["type"]); !ok || (p.Type != "json" && p.Type != "string") {
		return p, errInvalidCacheType
	}
	if p.Value, ok = projectStringToken(members["value"]); !ok {
		return p, errInvalidCacheValue
	}
	if p.Type == "json" && jsonx.Check([]byte(p.Value)) != nil {
		return p, errInvalidCacheValue
	}
	ttl, present := members["ttlSeconds"]
	if p.TTL, err = parseCacheTTL(ttl, present); err != nil {
		return p, err
	}
	if co, present := members["createOnly"]; present {
		switch string(co) {
		case "true":
			p.CreateOnly = true
		case "false":
		default:
			return p, errInvalidJSON
		}
	}
	return p, nil
}

func (s *Server) putCache(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleWrite)
	if err != nil {
		return err
	}
	b, err := readProjectBody(w, r)
	if err != nil {
		return err
	}
	put, err := parseCachePut(b)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	if project.CacheItemSize(put.Key, put.Value) > pr.info.CacheQuotaBytes {
		return errCacheQuotaExceeded
	}
	m := pr.info.Mirror()
	if m.LegacyDeadlineMs == 0 {
		// The next PUT in the project fixes the legacy deadline in
		// PostgreSQL (the truth) and its Redis mirror together.
		exists, candidate, err := s.prj.cache.LegacyDeadlineCandidate(ctx, pr.keys)
		if err != nil {
			return err
		}
		if exists {
			if m.LegacyDeadlineMs, err = s.store.FixLegacyDeadline(ctx, pr.info.ID, candidate, s.projectMirror(pr.keys)); err != nil {
				return err
			}
		}
	}
	item, created, err := s.prj.cache.Put(ctx, pr.keys, m, put)
	if err != nil {
		if errors.Is(err, project.ErrCacheKeyExists) {
			err = errCacheKeyExists
		}
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, toCacheItemDTO(item))
	return nil
}

func (s *Server) deleteCache(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleWrite)
	if err != nil {
		return err
	}
	keys := r.URL.Query()["key"]
	if len(keys) != 1 || !project.ValidCacheKey(keys[0]) {
		return errInvalidCacheKey
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	if err := s.prj.cache.Delete(ctx, pr.keys, pr.info.Mirror(), keys[0]); err != nil {
		if errors.Is(err, project.ErrCacheKeyNotFound) {
			err = errCacheKeyNotFound
		}
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listCache streams one page: the plan (structure checks, which items,
// legacy values) happens before the status line, so every refusal is a
// proper error; normal values are then read in pipelined batches and
// written as they arrive, so a page of up to 4 MiB of values is never
// encoded as one buffer.
func (s *Server) listCache(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleRead)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	limit, err := parseLimit(r, project.CachePageDefault, project.CachePageMax)
	if err != nil {
		return err
	}
	cur, err := project.ParseCacheCursor(q.Get("cursor"))
	if err != nil {
		return err
	}
	ctx := r.Context()
	m := pr.info.Mirror()
	page, err := s.prj.cache.PlanPage(ctx, pr.keys, m, project.CacheQuery{
		Search: q.Get("search"), Prefix: q.Get("prefix"), Cursor: cur, Limit: limit, MaxValueBytes: project.CachePageValueBytes})
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	_, _ = bw.WriteString(`{"items":[`)
	n := 0
	err = s.prj.cache.EachItem(ctx, pr.keys, page, func(it project.CacheItem) error {
		b, err := json.Marshal(toCacheItemDTO(it))
		if err != nil {
			return err
		}
		if n > 0 {
			_ = bw.WriteByte(',')
		}
		n++
		_, err = bw.Write(b)
		return err
	})
	if err != nil {
		// Half a page is already on the wire: cut the response so the
		// client sees a failure instead of a short, valid-looking page.
		s.metrics.errors.WithLabelValues("redis", "project_cache_list").Inc()
		s.logger.LogAttrs(ctx, slog.LevelWarn, "project cache listing aborted",
			slog.String("request_id", requestID(ctx)), slog.String("kind", store.Kind(err)))
		panic(http.ErrAbortHandler)
	}
	_, _ = bw.WriteString(`],"nextCursor":`)
	if page.Next == "" {
		_, _ = bw.WriteString("null}")
	} else {
		nb, _ := json.Marshal(page.Next)
		_, _ = bw.Write(nb)
		_ = bw.WriteByte('}')
	}
	_ = bw.Flush()
	// Lazy cleanup of what the listing found expired or evicted; best
	// effort (refused under OOM, where the listing itself still works).
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := s.prj.cache.PruneAfter(pctx, pr.keys, m, page); err != nil {
		s.metrics.errors.WithLabelValues("redis", "project_cache_prune").Inc()
	}
	return nil
}
