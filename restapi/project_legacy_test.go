package restapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
)

// importLegacy writes legacy v1 entries as the pre-upgrade service did (the
// same function hanctl project legacy-import calls).
func (h *prjHarness) importLegacy(p testProject, ttl time.Duration, kv ...string) {
	h.t.Helper()
	var es []project.LegacyEntry
	for i := 0; i+2 < len(kv); i += 3 {
		es = append(es, project.LegacyEntry{Key: kv[i], Type: kv[i+1], Value: kv[i+2]})
	}
	if err := project.ImportLegacyCache(context.Background(), h.rdb, p.keys, es, ttl); err != nil {
		h.t.Fatal(err)
	}
}

func (h *prjHarness) pgDeadline(p testProject) int64 {
	h.t.Helper()
	var d *int64
	if err := h.pool.QueryRow(context.Background(), "SELECT legacy_deadline_ms FROM projects WHERE id=$1", p.id).Scan(&d); err != nil {
		h.t.Fatal(err)
	}
	if d == nil {
		return 0
	}
	return *d
}

func (h *prjHarness) redisNowMs() int64 {
	h.t.Helper()
	tm, err := h.admin.Time(context.Background()).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return tm.UnixMilli()
}

func near(a, b, tol int64) bool { return a-b <= tol && b-a <= tol }

const grace = int64(30 * 24 * time.Hour / time.Millisecond)

func TestProjectLegacyContainerWithTTL(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	h.putKV(p, "normal", "n", 600) // before the container exists: fixes nothing
	if d := h.pgDeadline(p); d != 0 {
		t.Fatalf("a PUT without legacy data fixed a deadline: %d", d)
	}
	h.importLegacy(p, time.Hour, "b", "string", "2", "a", "json", `{"x":1}`)
	reclaim := h.admin.PExpireTime(ctx, p.keys.CacheContainer()).Val().Milliseconds()

	items := h.list(p.read, p, "").Items
	if len(items) != 3 || items[0].Key != "a" || items[1].Key != "b" || items[2].Key != "normal" {
		t.Fatalf("legacy entries first, by key: %+v", items)
	}
	for _, it := range items[:2] {
		if !it.LegacyNoExpiry || it.LegacyDeadlinePending || it.UpdatedAt != nil || !near(it.ExpiresAt, reclaim, 1000) {
			t.Fatalf("legacy item %+v, container reclaim %d", it, reclaim)
		}
	}
	if items[0].Type != "json" || items[0].Value != `{"x":1}` || items[0].SizeBytes != int64(len("a")+len(`{"x":1}`)) {
		t.Fatalf("legacy json item: %+v", items[0])
	}
	if items[2].LegacyNoExpiry || items[2].UpdatedAt == nil {
		t.Fatalf("normal item: %+v", items[2])
	}
	// The next PUT fixes the container's reclaim time as the deadline.
	h.putKV(p, "other", "o", 600)
	d := h.pgDeadline(p)
	if !near(d, reclaim, 1000) {
		t.Fatalf("fixed deadline %d, container reclaim %d", d, reclaim)
	}
	for _, it := range h.list(p.read, p, "?prefix=a").Items {
		if it.ExpiresAt != d || it.LegacyDeadlinePending {
			t.Fatalf("after the fix: %+v, deadline %d", it, d)
		}
	}
	if got := h.admin.PExpireTime(ctx, p.keys.CacheContainer()).Val().Milliseconds(); got != d {
		t.Fatalf("container reclaim %d, deadline %d", got, d)
	}
}

func TestProjectLegacyContainerWithoutTTL(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	h.importLegacy(p, 0, "a", "string", "1", "b", "string", "2", "c", "json", "[]")

	// Pending: query time + 30 days, moving with every read.
	first := h.list(p.read, p, "").Items
	if len(first) != 3 {
		t.Fatalf("listing: %+v", first)
	}
	now := h.redisNowMs()
	for _, it := range first {
		if !it.LegacyNoExpiry || !it.LegacyDeadlinePending || !near(it.ExpiresAt, now+grace, 2000) {
			t.Fatalf("pending legacy item %+v (now %d)", it, now)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return h.list(p.read, p, "").Items[0].ExpiresAt > first[0].ExpiresAt
	}, "a pending legacy deadline must move with the query time")
	if d := h.pgDeadline(p); d != 0 || h.admin.PTTL(ctx, p.keys.CacheContainer()).Val() != -1 {
		t.Fatal("a read fixed the deadline or touched the container")
	}
	code, b := h.do(p.read, "GET", p.path(""), "")
	if code != 200 || !strings.Contains(string(b), `"legacyEntries":3`) || !strings.Contains(string(b), `"legacyDeadlinePending":true`) {
		t.Fatalf("snapshot: %d %s", code, b)
	}

	// The next PUT fixes it: write time + 30 days, in PostgreSQL and on the
	// container.
	before := h.redisNowMs()
	h.putKV(p, "x", "1", 600)
	d := h.pgDeadline(p)
	if d < before+grace || d > h.redisNowMs()+grace {
		t.Fatalf("fixed deadline %d, write time %d + 30 days", d, before)
	}
	if got := h.admin.PExpireTime(ctx, p.keys.CacheContainer()).Val().Milliseconds(); got != d {
		t.Fatalf("container reclaim %d, deadline %d", got, d)
	}
	for _, it := range h.list(p.read, p, "").Items {
		if it.LegacyNoExpiry && (it.ExpiresAt != d || it.LegacyDeadlinePending) {
			t.Fatalf("after the fix: %+v, deadline %d", it, d)
		}
	}
	// Later writes never move it.
	testenv.Eventually(t, 5*time.Second, func() bool { return h.redisNowMs() > before+50 }, "clock")
	h.putKV(p, "y", "2", 600)
	h.putKV(p, "x", "3", 60)
	if code, b := h.do(p.write, "DELETE", p.path("/cache?key=y"), ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	if got := h.pgDeadline(p); got != d {
		t.Fatalf("a later write moved the deadline %d → %d", d, got)
	}
	if got := h.admin.PExpireTime(ctx, p.keys.CacheContainer()).Val().Milliseconds(); got != d {
		t.Fatalf("a later write moved the container's reclaim time %d → %d", d, got)
	}

	// createOnly sees a legacy key; overwriting it makes it a normal entry.
	code, b = h.put(p.write, p, `{"key":"b","type":"string","value":"new","createOnly":true}`)
	wantError(t, code, b, 409, "cache_key_exists")
	code, b = h.put(p.write, p, `{"key":"a","type":"string","value":"new","ttlSeconds":120}`)
	if code != 200 {
		t.Fatalf("overwrite legacy: %d %s", code, b)
	}
	var a *cacheItem
	for _, it := range h.list(p.read, p, "").Items {
		if it.Key == "a" {
			if a != nil {
				t.Fatal("a listed twice")
			}
			a = &it
		}
	}
	if a == nil || a.LegacyNoExpiry || a.Value != "new" || a.UpdatedAt == nil || h.admin.HExists(ctx, p.keys.CacheContainer(), "a").Val() {
		t.Fatalf("overwritten legacy key: %+v", a)
	}
	if pttl := h.admin.PTTL(ctx, p.keys.CacheEntry("a")).Val(); pttl < 119*time.Second || pttl > 120*time.Second {
		t.Fatalf("overwritten legacy key TTL %v", pttl)
	}
	// Deleting a legacy key.
	if code, b := h.do(p.write, "DELETE", p.path("/cache?key=b"), ""); code != 204 {
		t.Fatalf("delete legacy: %d %s", code, b)
	}
	code, b = h.do(p.write, "DELETE", p.path("/cache?key=b"), "")
	wantError(t, code, b, 404, "cache_key_not_found")
}

func TestProjectLegacyPaging(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	for _, k := range []string{"n1", "n2", "n3"} {
		h.putKV(p, k, "v", 600)
	}
	h.importLegacy(p, 0, "l5", "string", "5", "l1", "string", "1", "l3", "string", "3", "l2", "string", "2", "l4", "string", "4")
	var order, cursors []string
	cursor := ""
	for i := 0; i < 10; i++ {
		q := "?limit=2"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		page := h.list(p.read, p, q)
		for _, it := range page.Items {
			order = append(order, it.Key)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
		cursors = append(cursors, cursor)
	}
	if strings.Join(order, ",") != "l1,l2,l3,l4,l5,n1,n2,n3" {
		t.Fatalf("order: %v", order)
	}
	if len(cursors) != 3 || !strings.HasPrefix(cursors[0], "L") || !strings.HasPrefix(cursors[1], "L") || strings.HasPrefix(cursors[2], "L") {
		t.Fatalf("cursors: %v", cursors)
	}
	// Filters apply to legacy entries too.
	if got := h.list(p.read, p, "?search=3"); len(got.Items) != 2 || got.Items[0].Key != "l3" || got.Items[1].Key != "n3" {
		t.Fatalf("search 3: %+v", got.Items)
	}
}

func TestProjectLegacyEntriesGoAtTheDeadline(t *testing.T) {
	h := newPrjHarness(t)
	ctx := context.Background()
	t.Run("container reclaim time", func(t *testing.T) {
		defer h.as(t)()
		p := h.project()
		h.importLegacy(p, 2500*time.Millisecond, "a", "string", "1")
		h.putKV(p, "n", "v", 600) // fixes the deadline = the container's reclaim time
		if h.pgDeadline(p) == 0 {
			t.Fatal("deadline not fixed")
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			return len(h.list(p.read, p, "").Items) == 1 && h.admin.Exists(ctx, p.keys.CacheContainer()).Val() == 0
		}, "legacy entries outlive their deadline")
	})
	t.Run("fixed deadline on a container without TTL", func(t *testing.T) {
		defer h.as(t)()
		p := h.project()
		h.importLegacy(p, 0, "a", "string", "1", "b", "string", "2")
		// A deadline fixed earlier (PostgreSQL), container restored without
		// a TTL: entries are hidden at the deadline and the listing's
		// cleanup removes the container.
		if _, err := h.pool.Exec(ctx, "UPDATE projects SET legacy_deadline_ms=$2 WHERE id=$1", p.id, h.redisNowMs()+2000); err != nil {
			t.Fatal(err)
		}
		if got := h.list(p.read, p, "").Items; len(got) != 2 || got[0].LegacyDeadlinePending {
			t.Fatalf("before the deadline: %+v", got)
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			return len(h.list(p.read, p, "").Items) == 0 && h.admin.Exists(ctx, p.keys.CacheContainer()).Val() == 0
		}, "legacy entries outlive a fixed deadline")
		code, b := h.do(p.write, "DELETE", p.path("/cache?key=a"), "")
		wantError(t, code, b, 404, "cache_key_not_found")
	})
}

// After an empty Redis restore the legacy deadline PostgreSQL fixed stays
// fixed, even when legacy data comes back from an old dump.
func TestProjectLegacyDeadlineSurvivesEmptyRestore(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newPrjHarnessOn(t, rs, rs.URL(0))
	p := h.project()
	ctx := context.Background()
	h.importLegacy(p, 0, "a", "string", "1")
	h.putKV(p, "n", "v", 600)
	d := h.pgDeadline(p)
	if d == 0 {
		t.Fatal("deadline not fixed")
	}
	if err := rs.Restart(); err != nil { // no AOF: the server comes back empty
		t.Fatal(err)
	}
	h.admin = rs.AdminClient(0)
	defer h.admin.Close()
	if n := h.admin.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("restart kept %d keys", n)
	}
	// The old dump's container comes back (without a TTL).
	testenv.Eventually(t, 5*time.Second, func() bool {
		return project.ImportLegacyCache(ctx, h.rdb, p.keys, []project.LegacyEntry{{Key: "a", Type: "string", Value: "1"}}, 0) == nil
	}, "client did not reconnect")
	items := h.list(p.read, p, "").Items
	if len(items) != 1 || items[0].ExpiresAt != d || items[0].LegacyDeadlinePending {
		t.Fatalf("after an empty restore: %+v, fixed deadline %d", items, d)
	}
	h.putKV(p, "m", "v", 600)
	if got := h.pgDeadline(p); got != d {
		t.Fatalf("deadline moved %d → %d", d, got)
	}
	if got := h.admin.PExpireTime(ctx, p.keys.CacheContainer()).Val().Milliseconds(); got != d {
		t.Fatalf("container reclaim %d, fixed deadline %d", got, d)
	}
}

// A legacy container restored from a pre-upgrade dump may hold fields no
// PUT or import could write: longer than a cache key may be, empty, or not
// UTF-8. A page that ends on one returns it as the cursor
// (L<base64url(key)>), and the server must take that cursor back: it used
// to refuse a key over 256 bytes or not UTF-8 with 400 invalid_cursor, so
// the listing could never get past it.
func TestProjectLegacyPagingPastFieldsNoPutCouldWrite(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	long := strings.Repeat("x", 300)
	entry := func(v string) string { return `{"type":"string","value":"` + v + `"}` }
	if err := h.admin.HSet(context.Background(), p.keys.CacheContainer(),
		"", entry("empty"), long, entry("long"), "\xff\xfe", entry("binary"), "z", entry("z")).Err(); err != nil {
		t.Fatal(err)
	}
	var values []string
	cursor := ""
	for range 10 {
		q := "?limit=1"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		page := h.list(p.read, p, q) // fails the test unless 200
		for _, it := range page.Items {
			values = append(values, it.Value)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	// Byte order: "", the long key, "z", then "\xff\xfe".
	if got := strings.Join(values, ","); got != "empty,long,z,binary" {
		t.Fatalf("paging through the legacy entries listed %q", got)
	}
}
