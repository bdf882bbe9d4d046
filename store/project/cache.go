package project

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Project cache errors, each mapped to one stable code (docs/errors.md).
var (
	ErrCacheKeyNotFound = errors.New("project: cache key not found")
	ErrCacheKeyExists   = errors.New("project: cache key exists")
	// ErrCacheQuotaExceeded means the item is above the quota mirrored in
	// Redis, which a settings change may have lowered after the request
	// read PostgreSQL's (the request checks that one itself).
	ErrCacheQuotaExceeded = errors.New("project: cache quota exceeded")
	// ErrDataStateInvalid means a project's Redis structure is inconsistent
	// (a key of the wrong type, metadata missing while data keys exist, a
	// counter below zero, a write sequence behind its index, an unreadable
	// legacy entry). The request fails without writing.
	ErrDataStateInvalid = errors.New("project: project data state invalid")
)

// Project cache constants (docs/project-redis-api.md).
const (
	// cachePurgeBatch bounds how many expired index members one write
	// script forgets on the way.
	cachePurgeBatch = 64
	// stateExpiredBound bounds how many expired-but-unpurged members the
	// state script subtracts from the usage and entries it reports, and how
	// many one cleanup forgets when State finds more of them waiting.
	stateExpiredBound = 1000
)

// Mirror is the PostgreSQL metadata that project scripts mirror into
// the project's Redis metadata HASH.
type Mirror struct {
	CacheQuotaBytes  int64
	DeliveryPaused   bool
	LegacyDeadlineMs int64 // 0: not fixed
}

// CacheItem is one cache entry as the API shows it. Timestamps are epoch ms.
type CacheItem struct {
	Key       string
	Type      string // "json" | "string"
	Value     string
	SizeBytes int64 // UTF-8 bytes of key + value
	ExpiresAt int64
	UpdatedAt int64 // 0 for legacy entries (unknown)
	// LegacyNoExpiry marks an entry saved as "never expires" before the
	// upgrade; LegacyDeadlinePending says its deadline still moves.
	LegacyNoExpiry        bool
	LegacyDeadlinePending bool
}

// ValidCacheKey reports whether k is a valid relative cache key: 1..256
// bytes of UTF-8 without control characters (Unicode category Cc).
func ValidCacheKey(k string) bool {
	if len(k) == 0 || len(k) > CacheKeyMaxBytes || !utf8.ValidString(k) {
		return false
	}
	for _, r := range k {
		if unicode.Is(unicode.Cc, r) {
			return false
		}
	}
	return true
}

// CacheItemSize is the size an item counts against the quota.
func CacheItemSize(key, value string) int64 { return int64(len(key) + len(value)) }

// CachePut is one validated PUT /cache.
type CachePut struct {
	Key, Type, Value string
	TTL              time.Duration
	CreateOnly       bool
}

// Cache is the Redis side of the project cache. Safe for concurrent
// use.
type Cache struct {
	rdb redis.UniversalClient
}

// NewCache returns the project cache over the DB0 client.
func NewCache(rdb redis.UniversalClient) *Cache { return &Cache{rdb: rdb} }

// classifyProject maps script and read failures: a structure problem
// becomes ErrDataStateInvalid, everything else goes through
// ClassifyRedisError (no raw Redis text survives either way).
func classifyProject(err error) error {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, ErrDataStateInvalid) {
		return err
	}
	msg := err.Error()
	if strings.Contains(msg, "data_state_invalid") || strings.HasPrefix(msg, "WRONGTYPE") {
		return ErrDataStateInvalid
	}
	return rds.ClassifyRedisError(err)
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

// CachePutResult is what one Put did.
type CachePutResult struct {
	Item    CacheItem
	Created bool // a new key (201) rather than a replaced one (200)
	// MirrorDiffers says the metadata HASH mirrors other values than the
	// Mirror passed to Put: a settings change landed after the request read
	// PostgreSQL, or the mirror is stale (a change whose repair failed, a
	// restored dump). It is also set along with ErrCacheKeyExists and
	// ErrCacheQuotaExceeded.
	MirrorDiffers bool
}

// Put writes one entry and its physical expiry in one script.
// ErrCacheKeyExists when CreateOnly finds the key (normal or legacy);
// ErrCacheQuotaExceeded when the item is above the quota the metadata
// HASH mirrors. m only creates the mirror when the HASH does not hold it
// yet (a new project, an empty Redis restore): one already there was
// written by SyncMeta, maybe after the request read PostgreSQL, and a PUT
// must not rewind it.
func (c *Cache) Put(ctx context.Context, k Keys, m Mirror, p CachePut) (CachePutResult, error) {
	size := CacheItemSize(p.Key, p.Value)
	res, err := lua.ProjectCachePut.Run(ctx, c.rdb, k.cacheScriptKeys(k.CacheEntry(p.Key)),
		p.Key, p.Type, p.Value, p.TTL.Milliseconds(), b01(p.CreateOnly), size,
		m.CacheQuotaBytes, b01(m.DeliveryPaused), m.LegacyDeadlineMs, cachePurgeBatch).Int64Slice()
	if err != nil {
		return CachePutResult{}, classifyProject(err)
	}
	if len(res) != 5 {
		return CachePutResult{}, ErrDataStateInvalid
	}
	r := CachePutResult{MirrorDiffers: res[4] == 1}
	switch res[0] {
	case 0:
		return r, ErrCacheKeyExists
	case 3:
		return r, ErrCacheQuotaExceeded
	}
	r.Item = CacheItem{Key: p.Key, Type: p.Type, Value: p.Value, SizeBytes: size, ExpiresAt: res[2], UpdatedAt: res[3]}
	r.Created = res[0] == 1
	return r, nil
}

// Delete removes one entry (normal or legacy); ErrCacheKeyNotFound when
// there is none.
func (c *Cache) Delete(ctx context.Context, k Keys, m Mirror, key string) error {
	res, err := lua.ProjectCacheDelete.Run(ctx, c.rdb, k.cacheScriptKeys(k.CacheEntry(key)),
		key, m.LegacyDeadlineMs, cachePurgeBatch).Int64Slice()
	if err != nil {
		return classifyProject(err)
	}
	if len(res) != 2 {
		return ErrDataStateInvalid
	}
	if res[0] == 0 {
		return ErrCacheKeyNotFound
	}
	return nil
}

// SyncMeta mirrors PostgreSQL metadata into the metadata HASH.
func (c *Cache) SyncMeta(ctx context.Context, k Keys, m Mirror) error {
	err := lua.ProjectMetaSync.Run(ctx, c.rdb, k.cacheScriptKeys()[:4],
		m.CacheQuotaBytes, b01(m.DeliveryPaused), m.LegacyDeadlineMs).Err()
	return classifyProject(err)
}

// CacheRef names an index member found without its entry.
type CacheRef struct {
	Key string
	Seq int64
}

// Prune forgets index members whose entries were found gone, purges expired
// members and applies a fixed legacy deadline to the container. Callers
// treat it as best effort.
func (c *Cache) Prune(ctx context.Context, k Keys, m Mirror, stale []CacheRef) error {
	args := make([]any, 0, 2+2*len(stale))
	args = append(args, m.LegacyDeadlineMs, cachePurgeBatch)
	for _, s := range stale {
		args = append(args, s.Key, s.Seq)
	}
	return classifyProject(lua.ProjectCachePrune.Run(ctx, c.rdb, k.cacheScriptKeys(), args...).Err())
}

// CacheState is the state a listing or a snapshot starts from.
type CacheState struct {
	NowMs      int64 // Redis TIME
	MetaExists bool
	Seq        int64 // last write sequence
	UsageBytes int64 // sizes of entries not yet past their deadline
	Entries    int64 // normal entries not yet past their deadline
	// LegacyEntries is the number of fields of the legacy container and
	// ContainerPTTL its remaining TTL in ms (-1 none, -2 absent).
	LegacyEntries int64
	ContainerPTTL int64
}

// State reads the project's cache state with the structure checks (a
// no-writes script: works under OOM). Its usage and entry count are exact:
// the script leaves out at most stateExpiredBound index members past their
// deadline (a bounded cost), so when more of them wait to be forgotten,
// State forgets them first, stateExpiredBound per cleanup script (allow-oom,
// like every cleanup), and reads again, at most stateCleanupPasses times so
// that one read costs a bounded number of round trips. Should members
// expire faster than the cleanups forget them, more of them wait than those
// passes forget, or a cleanup fail (they are best effort everywhere), it
// returns the last read, whose two figures still describe the same entries
// (the expired ones beyond the bound counted in both).
func (c *Cache) State(ctx context.Context, k Keys) (CacheState, error) {
	st, expired, err := c.readState(ctx, k)
	if err != nil {
		return CacheState{}, err
	}
	for range stateCleanupPasses {
		if expired <= stateExpiredBound {
			break
		}
		if classifyProject(lua.ProjectCachePrune.Run(ctx, c.rdb, k.cacheScriptKeys(), 0, stateExpiredBound).Err()) != nil {
			break
		}
		next, after, err := c.readState(ctx, k)
		if err != nil {
			break
		}
		progress := after < expired
		st, expired = next, after
		if !progress {
			break
		}
	}
	return st, nil
}

// stateCleanupPasses bounds the cleanups one State runs: each forgets
// stateExpiredBound expired members.
const stateCleanupPasses = 8

// readState runs the state script once; expired is how many index members
// past their deadline it found.
func (c *Cache) readState(ctx context.Context, k Keys) (st CacheState, expired int64, err error) {
	res, err := lua.ProjectCacheState.Run(ctx, c.rdb, k.cacheScriptKeys(), stateExpiredBound).Slice()
	if err != nil {
		return CacheState{}, 0, classifyProject(err)
	}
	if len(res) < 11 {
		return CacheState{}, 0, ErrDataStateInvalid
	}
	// The state's figures and the expired count; the mirror fields between
	// them (7 to 9) are not read here.
	var n [8]int64
	for i, j := range [8]int{0, 1, 2, 3, 4, 5, 6, 10} {
		v, ok := res[j].(int64)
		if !ok {
			return CacheState{}, 0, ErrDataStateInvalid
		}
		n[i] = v
	}
	return CacheState{NowMs: n[0], MetaExists: n[1] == 1, Seq: n[2], UsageBytes: n[3], Entries: n[4],
		LegacyEntries: n[5], ContainerPTTL: n[6]}, n[7], nil
}

// LegacyDeadlineCandidate looks at the legacy container before a PUT: when
// one exists it returns the deadline that PUT fixes (the container's
// physical reclaim time if it has a TTL, else Redis time + 30 days).
func (c *Cache) LegacyDeadlineCandidate(ctx context.Context, k Keys) (exists bool, candidateMs int64, err error) {
	var typ *redis.StatusCmd
	var pttl *redis.DurationCmd
	var now *redis.TimeCmd
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		typ = p.Type(ctx, k.CacheContainer())
		pttl = p.PTTL(ctx, k.CacheContainer())
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		return false, 0, classifyProject(err)
	}
	switch typ.Val() {
	case "none":
		return false, 0, nil
	case "hash":
	default:
		return false, 0, ErrDataStateInvalid
	}
	nowMs := now.Val().UnixMilli()
	if d := pttl.Val(); d > 0 {
		return true, nowMs + d.Milliseconds(), nil
	}
	return true, nowMs + LegacyGrace.Milliseconds(), nil
}

// legacyExpiry is when legacy entries expire as of a read: the fixed
// deadline, else the container's reclaim time, else read time + 30 days
// (pending: it moves with every read until a PUT fixes it).
func legacyExpiry(m Mirror, st CacheState) (expiresAt int64, pending bool) {
	switch {
	case m.LegacyDeadlineMs > 0:
		return m.LegacyDeadlineMs, false
	case st.ContainerPTTL > 0:
		return st.NowMs + st.ContainerPTTL, false
	default:
		return st.NowMs + LegacyGrace.Milliseconds(), true
	}
}

// LegacyView is what a snapshot says about legacy entries.
type LegacyView struct {
	Entries   int64
	ExpiresAt int64 // 0 when there are none
	Pending   bool
}

// Legacy summarises the legacy entries visible in st.
func (st CacheState) Legacy(m Mirror) LegacyView {
	if st.LegacyEntries == 0 || (m.LegacyDeadlineMs > 0 && m.LegacyDeadlineMs <= st.NowMs) {
		return LegacyView{}
	}
	exp, pending := legacyExpiry(m, st)
	return LegacyView{Entries: st.LegacyEntries, ExpiresAt: exp, Pending: pending}
}

// parseStoredInt reads a non-negative decimal integer a script stored:
// digits only, no sign, no leading zero, within int64. Any other spelling
// ("1.5", "1e3", "-1", "007", "") is data no script wrote.
func parseStoredInt(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok || s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
