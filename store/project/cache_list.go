package project

import (
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/jsonx"
)

// CacheCursor is a position in a cache listing. Legacy entries come first,
// ordered by key, with opaque cursors "L<base64url(key)>"; normal entries
// follow in write-sequence order with the sequence as the cursor (decimal).
// The zero value is the start.
type CacheCursor struct {
	Legacy bool   // a position among legacy entries (after Key)
	Key    string // last legacy key returned
	Seq    int64  // normal entries: last write sequence consumed
	set    bool
}

// legacyCursorKeyMaxBytes bounds the key a legacy cursor may carry. A
// legacy field restored from a pre-upgrade dump is not held to the rules of
// a cache key (it may be longer than CacheKeyMaxBytes, empty, or not UTF-8),
// and a listing that ends its page on it returns it as the cursor, so every
// such key must parse back. The bound is the largest cache item a project
// can have, as for legacy import; a cursor's key is only compared with the
// container's fields, never used to name a key.
const legacyCursorKeyMaxBytes = CacheQuotaMaxBytes

// ParseCacheCursor parses a cursor returned by a listing; "" is the start.
// Anything else, another spelling of a cursor included, fails with
// ErrInvalidCursor.
func ParseCacheCursor(s string) (CacheCursor, error) {
	if s == "" {
		return CacheCursor{}, nil
	}
	if rest, ok := strings.CutPrefix(s, "L"); ok {
		if base64.RawURLEncoding.DecodedLen(len(rest)) > legacyCursorKeyMaxBytes {
			return CacheCursor{}, ErrInvalidCursor
		}
		// Only the spelling a listing issues: the decoder also takes
		// non-zero padding bits and skips CR and LF, which would give
		// other spellings of the same key.
		b, err := base64.RawURLEncoding.DecodeString(rest)
		if err != nil || base64.RawURLEncoding.EncodeToString(b) != rest {
			return CacheCursor{}, ErrInvalidCursor
		}
		return CacheCursor{Legacy: true, Key: string(b), set: true}, nil
	}
	if len(s) > 19 {
		return CacheCursor{}, ErrInvalidCursor
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return CacheCursor{}, ErrInvalidCursor
		}
	}
	// A listing issues the sequence of an entry it examined: at least 1,
	// without a leading zero.
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || s[0] == '0' {
		return CacheCursor{}, ErrInvalidCursor
	}
	return CacheCursor{Seq: n, set: true}, nil
}

// String is the cursor's wire form.
func (c CacheCursor) String() string {
	if c.Legacy {
		return "L" + base64.RawURLEncoding.EncodeToString([]byte(c.Key))
	}
	return strconv.FormatInt(c.Seq, 10)
}

// inLegacy reports whether the listing still starts among legacy entries.
func (c CacheCursor) inLegacy() bool { return !c.set || c.Legacy }

// CacheQuery is one GET /cache.
type CacheQuery struct {
	Search, Prefix string // substring / prefix of the relative key
	Cursor         CacheCursor
	Limit          int   // 1..100
	MaxValueBytes  int64 // a page stops before its values pass this (one item at least)
	// MaxScan bounds how many index members one page examines, so a filter
	// that matches little cannot make a request walk the whole index; the
	// page then ends early with a cursor to continue. Zero value means 1000.
	MaxScan int
}

func (q CacheQuery) match(key string) bool {
	return strings.HasPrefix(key, q.Prefix) && strings.Contains(key, q.Search)
}

// CachePage is a planned page: which items it holds in which order, with
// legacy values already read (they come from one container) and normal
// values left for EachItem to read in pipelined batches while the response
// is streamed.
type CachePage struct {
	State CacheState
	// Next is the cursor of the following page; "" means none.
	Next  string
	items []pageItem
	stale []CacheRef
}

type pageItem struct {
	CacheItem
	seq    int64 // normal entries: the write sequence planned
	legacy bool
}

// Len is the number of planned items (EachItem may skip some that expire
// in between).
func (p *CachePage) Len() int { return len(p.items) }

const listBatch = 128

// PlanPage plans one listing page: the state and structure checks, the
// legacy part (ordered by key) and the normal part (write-sequence order),
// stopping at q.Limit items or q.MaxValueBytes of values.
func (c *Cache) PlanPage(ctx context.Context, k Keys, m Mirror, q CacheQuery) (*CachePage, error) {
	if q.MaxScan <= 0 {
		q.MaxScan = 1000
	}
	st, err := c.State(ctx, k)
	if err != nil {
		return nil, err
	}
	page := &CachePage{State: st}
	budget := q.MaxValueBytes
	if q.Cursor.inLegacy() {
		lv := st.Legacy(m)
		if lv.Entries > 0 {
			full, err := c.planLegacy(ctx, k, q, lv, page, &budget)
			if err != nil || full {
				return page, err
			}
		}
	}
	return page, c.planNormal(ctx, k, q, page, &budget)
}

// planLegacy adds legacy entries; full is true when the page ended inside
// them (page.Next is then set).
func (c *Cache) planLegacy(ctx context.Context, k Keys, q CacheQuery, lv LegacyView, page *CachePage, budget *int64) (full bool, err error) {
	fields, err := c.rdb.HKeys(ctx, k.CacheContainer()).Result()
	if err != nil {
		return false, classifyProject(err)
	}
	keys := fields[:0]
	for _, f := range fields {
		if q.match(f) && (!q.Cursor.Legacy || f > q.Cursor.Key) {
			keys = append(keys, f)
		}
	}
	slices.Sort(keys)
	for start := 0; start < len(keys); start += 32 {
		chunk := keys[start:min(start+32, len(keys))]
		sizes := make([]*redis.IntCmd, len(chunk))
		if _, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, f := range chunk {
				sizes[i] = p.HStrLen(ctx, k.CacheContainer(), f)
			}
			return nil
		}); err != nil {
			return false, classifyProject(err)
		}
		var take []string
		stop := false
		for i, f := range chunk {
			// A size of 0 is a field deleted meanwhile or an empty value,
			// which is no legacy entry: the read below tells them apart.
			sz := sizes[i].Val()
			if len(page.items)+len(take) >= q.Limit || (sz > *budget && len(page.items)+len(take) > 0) {
				stop = true
				break
			}
			*budget -= sz
			take = append(take, f)
		}
		if len(take) > 0 {
			vals, err := c.rdb.HMGet(ctx, k.CacheContainer(), take...).Result()
			if err != nil {
				return false, classifyProject(err)
			}
			for i, v := range vals {
				s, ok := v.(string)
				if !ok {
					continue
				}
				typ, value, ok := parseLegacyValue(s)
				if !ok {
					return false, ErrDataStateInvalid
				}
				page.items = append(page.items, pageItem{legacy: true, CacheItem: CacheItem{
					Key: take[i], Type: typ, Value: value, SizeBytes: CacheItemSize(take[i], value),
					ExpiresAt: lv.ExpiresAt, LegacyNoExpiry: true, LegacyDeadlinePending: lv.Pending}})
			}
		}
		if stop {
			if n := len(page.items); n > 0 {
				page.Next = CacheCursor{Legacy: true, Key: page.items[n-1].Key}.String()
			} else {
				page.Next = CacheCursor{Legacy: true, Key: take[len(take)-1]}.String()
			}
			return true, nil
		}
	}
	return false, nil
}

// LegacyValue is the v1 container's field format.
type LegacyValue struct {
	Type  *string `json:"type"`
	Value *string `json:"value"`
}

func parseLegacyValue(s string) (typ, value string, ok bool) {
	var lv LegacyValue
	if err := jsonx.DecodeObject([]byte(s), &lv); err != nil || lv.Type == nil || lv.Value == nil {
		return "", "", false
	}
	if *lv.Type != "json" && *lv.Type != "string" {
		return "", "", false
	}
	return *lv.Type, *lv.Value, true
}

type normalInfo struct {
	fields *redis.SliceCmd
	size   *redis.IntCmd
}

// entryFields is what a listing reads of an entry HASH (t, e, u, s and the
// length of v).
type entryFields struct {
	typ            string
	exp, upd, seq  int64
	size           int64
	gone, needsVal bool
}

// readEntryFields checks an entry HASH as the put script writes it: all of
// its fields or none. None is an entry Redis expired or evicted (gone).
// Some but not all, a type other than json or string, or a deadline,
// update time or sequence that is not a decimal integer is data no script
// wrote: the listing answers data_state_invalid rather than hide the entry
// or forget it. needsVal asks the caller to check that v exists (HSTRLEN
// is 0 both for an empty value and for none).
func readEntryFields(info *normalInfo) (entryFields, error) {
	f := info.fields.Val()
	if len(f) != 4 {
		return entryFields{}, ErrDataStateInvalid
	}
	if f[0] == nil && f[1] == nil && f[2] == nil && f[3] == nil {
		return entryFields{gone: true}, nil
	}
	typ, _ := f[0].(string)
	exp, okE := parseStoredInt(f[1])
	upd, okU := parseStoredInt(f[2])
	seq, okS := parseStoredInt(f[3])
	if (typ != "json" && typ != "string") || !okE || !okU || !okS {
		return entryFields{}, ErrDataStateInvalid
	}
	size := info.size.Val()
	return entryFields{typ: typ, exp: exp, upd: upd, seq: seq, size: size, needsVal: size == 0}, nil
}

// planNormal adds normal entries in write-sequence order after the cursor.
func (c *Cache) planNormal(ctx context.Context, k Keys, q CacheQuery, page *CachePage, budget *int64) error {
	after := int64(0)
	if !q.Cursor.inLegacy() {
		after = q.Cursor.Seq
	}
	scanned := 0
	for {
		batch, err := c.rdb.ZRangeByScoreWithScores(ctx, k.CacheIndex(), &redis.ZRangeBy{
			Min: "(" + strconv.FormatInt(after, 10), Max: "+inf", Count: listBatch}).Result()
		if err != nil {
			return classifyProject(err)
		}
		if len(batch) == 0 {
			return nil
		}
		infos := make([]*normalInfo, len(batch))
		if _, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, z := range batch {
				key, _ := z.Member.(string)
				if q.match(key) {
					e := k.CacheEntry(key)
					infos[i] = &normalInfo{fields: p.HMGet(ctx, e, "t", "e", "u", "s"), size: p.HStrLen(ctx, e, "v")}
				}
			}
			return nil
		}); err != nil {
			return classifyProject(err)
		}
		for i, z := range batch {
			seq := int64(z.Score)
			key, _ := z.Member.(string)
			if scanned >= q.MaxScan {
				page.Next = strconv.FormatInt(after, 10)
				return nil
			}
			if info := infos[i]; info != nil {
				e, err := c.entryFields(ctx, k, key, info)
				if err != nil {
					return err
				}
				switch {
				case e.gone:
					// Expired or evicted: forget it lazily.
					page.stale = append(page.stale, CacheRef{Key: key, Seq: seq})
				case e.seq != seq || e.exp <= page.State.NowMs:
					// Rewritten since (listed at its new sequence) or past
					// its deadline.
				default:
					if len(page.items) >= q.Limit || (e.size > *budget && len(page.items) > 0) {
						page.Next = strconv.FormatInt(after, 10)
						return nil
					}
					*budget -= e.size
					page.items = append(page.items, pageItem{seq: seq, CacheItem: CacheItem{
						Key: key, Type: e.typ, SizeBytes: CacheItemSize(key, "") + e.size, ExpiresAt: e.exp, UpdatedAt: e.upd}})
				}
			}
			after = seq
			scanned++
		}
		if len(batch) < listBatch {
			return nil
		}
	}
}

// entryFields is readEntryFields with the check that an entry whose value
// reads as empty has one (rare: one more round trip for such an entry).
func (c *Cache) entryFields(ctx context.Context, k Keys, key string, info *normalInfo) (entryFields, error) {
	e, err := readEntryFields(info)
	if err != nil || e.gone || !e.needsVal {
		return e, err
	}
	n, err := c.rdb.HLen(ctx, k.CacheEntry(key)).Result()
	if err != nil {
		return e, classifyProject(err)
	}
	switch n {
	case 0: // expired since the fields were read
		return entryFields{gone: true}, nil
	case 5:
		return e, nil
	}
	return e, ErrDataStateInvalid
}

// EachItem calls fn for every planned item in order, reading the values of
// normal entries with pipelined reads in batches of at most 32 items or
// 1 MiB. An entry that expired or was rewritten since planning is skipped.
// A Redis failure midway is returned (the caller has streamed part of the
// page and must abort the response).
func (c *Cache) EachItem(ctx context.Context, k Keys, page *CachePage, fn func(CacheItem) error) error {
	items := page.items
	for len(items) > 0 {
		if items[0].legacy {
			if err := fn(items[0].CacheItem); err != nil {
				return err
			}
			items = items[1:]
			continue
		}
		n, bytes := 0, int64(0)
		for n < len(items) && n < 32 && !items[n].legacy && (n == 0 || bytes+items[n].SizeBytes <= 1<<20) {
			bytes += items[n].SizeBytes
			n++
		}
		cmds := make([]*redis.SliceCmd, n)
		if _, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range n {
				cmds[i] = p.HMGet(ctx, k.CacheEntry(items[i].Key), "v", "s")
			}
			return nil
		}); err != nil {
			return classifyProject(err)
		}
		for i := range n {
			f := cmds[i].Val()
			v, okV := f[0].(string)
			s, okS := parseStoredInt(f[1])
			if !okV || !okS || s != items[i].seq {
				continue
			}
			it := items[i].CacheItem
			it.Value = v
			it.SizeBytes = CacheItemSize(it.Key, v)
			if err := fn(it); err != nil {
				return err
			}
		}
		items = items[n:]
	}
	return nil
}

// PruneAfter is the lazy cleanup after a listing: index members found
// without their entry, expired members and a legacy container past its
// fixed deadline. It only runs when there is something to do; callers
// ignore its failure (under OOM the listing has still been served).
func (c *Cache) PruneAfter(ctx context.Context, k Keys, m Mirror, page *CachePage) error {
	st := page.State
	legacyDue := false
	if d := m.LegacyDeadlineMs; d > 0 && st.LegacyEntries > 0 {
		// Past the deadline, or the container's reclaim time is not the
		// fixed deadline yet (a PUT that fixed it failed afterwards, or the
		// container was restored without a TTL).
		reclaim := st.NowMs + st.ContainerPTTL
		legacyDue = d <= st.NowMs || st.ContainerPTTL < 0 || reclaim < d-1000 || reclaim > d+1000
	}
	if len(page.stale) == 0 && !legacyDue {
		return nil
	}
	return c.Prune(ctx, k, m, page.stale)
}
