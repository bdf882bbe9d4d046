package restapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
)

// A settings change that Redis refuses (OOM) changes neither store: the
// answer is 503 redis_oom and PostgreSQL's row, the Redis metadata, the
// snapshot and claims all stay as they were; once memory returns, the same
// request applies in both.
func TestProjectSettingsUnderOOMChangeNeitherStore(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "64mb", EvictionPolicy: "noeviction"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newPrjHarnessOn(t, rs, rs.URL(0))
	p := h.project()
	ctx := context.Background()
	top := h.qTopic(p, "oom")
	sub := h.qSub(p, top.ID, "s")
	for i := range 2 {
		h.qPublish(p, top.ID, fmt.Sprint(i), `{}`)
	}
	// A first settings write creates the metadata mirror.
	if code, b := h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":4096}`); code != 200 {
		t.Fatalf("quota: %d %s", code, b)
	}
	meta := h.admin.HGetAll(ctx, p.keys.Meta()).Val()
	if meta["paused"] != "0" {
		t.Fatalf("metadata before: %v", meta)
	}
	pgSettings := func() string {
		var quota int64
		var paused bool
		if err := h.pool.QueryRow(ctx, "SELECT cache_quota_bytes, delivery_paused FROM projects WHERE id=$1", p.id).Scan(&quota, &paused); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("quota=%d paused=%v", quota, paused)
	}
	if got := pgSettings(); got != "quota=4096 paused=false" {
		t.Fatalf("PostgreSQL before: %s", got)
	}

	if err := h.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer h.admin.ConfigSet(ctx, "maxmemory", "0")
	if err := h.admin.Set(ctx, "filler", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("the server is not out of memory: %v", err)
	}
	code, b := h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":true}`)
	wantError(t, code, b, 503, "redis_oom")
	code, b = h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":8192}`)
	wantError(t, code, b, 503, "redis_oom")
	if got := pgSettings(); got != "quota=4096 paused=false" {
		t.Fatalf("PostgreSQL changed by refused settings writes: %s", got)
	}
	if after := h.admin.HGetAll(ctx, p.keys.Meta()).Val(); fmt.Sprint(after) != fmt.Sprint(meta) {
		t.Fatalf("metadata changed: %v → %v", meta, after)
	}
	if snapshotPaused(h, p) {
		t.Fatal("the snapshot reports a pause that was refused")
	}

	// Memory returns: delivery was never paused, and the same PUT applies.
	if err := h.admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if items := h.qClaim(p, sub.ID, 1); len(items) != 1 {
		t.Fatalf("claim after the refused pause: %d items", len(items))
	}
	if code, b := h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":true}`); code != 200 {
		t.Fatalf("pause after memory returned: %d %s", code, b)
	}
	if got := pgSettings(); got != "quota=4096 paused=true" {
		t.Fatalf("PostgreSQL after the pause: %s", got)
	}
	if v := h.admin.HGet(ctx, p.keys.Meta(), "paused").Val(); v != "1" {
		t.Fatalf("metadata paused = %q", v)
	}
	if !snapshotPaused(h, p) {
		t.Fatal("the snapshot does not report the pause")
	}
	code, b = h.qClaimRaw(p.write, p, sub.ID, 1)
	wantError(t, code, b, 409, "delivery_paused")
}

// snapshotPaused reads runtime.deliveryPaused from the project snapshot.
func snapshotPaused(h *prjHarness, p testProject) bool {
	h.t.Helper()
	code, b := h.do(p.read, "GET", p.path(""), "")
	if code != 200 {
		h.t.Fatalf("snapshot: %d %s", code, b)
	}
	return decode[struct {
		Runtime struct {
			DeliveryPaused bool `json:"deliveryPaused"`
		} `json:"runtime"`
	}](h.t, b).Runtime.DeliveryPaused
}

// The first cache PUT after legacy entries were imported fixes their
// deadline in PostgreSQL and in the Redis metadata together: a PUT refused
// by Redis (OOM) fixes it in neither, and the deadline stays pending.
func TestProjectLegacyDeadlineUnderOOMIsNotFixed(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "64mb", EvictionPolicy: "noeviction"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	h := newPrjHarnessOn(t, rs, rs.URL(0))
	p := h.project()
	ctx := context.Background()
	h.importLegacy(p, 0, "a", "string", "1")
	if err := h.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer h.admin.ConfigSet(ctx, "maxmemory", "0")
	code, b := h.put(p.write, p, `{"key":"k","type":"string","value":"v"}`)
	wantError(t, code, b, 503, "redis_oom")
	if d := h.pgDeadline(p); d != 0 {
		t.Fatalf("a refused PUT fixed the legacy deadline in PostgreSQL: %d", d)
	}
	if v := h.admin.HGet(ctx, p.keys.Meta(), "legacyDeadline").Val(); v != "" && v != "0" {
		t.Fatalf("a refused PUT fixed the legacy deadline in Redis: %q", v)
	}
	if items := h.list(p.read, p, "").Items; len(items) != 1 || !items[0].LegacyDeadlinePending {
		t.Fatalf("legacy entry after the refused PUT: %+v", items)
	}

	if err := h.admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	h.putKV(p, "k", "v", 600)
	d := h.pgDeadline(p)
	if d == 0 {
		t.Fatal("the PUT after memory returned did not fix the deadline")
	}
	if v := h.admin.HGet(ctx, p.keys.Meta(), "legacyDeadline").Val(); v != fmt.Sprint(d) {
		t.Fatalf("Redis legacy deadline %q, PostgreSQL %d", v, d)
	}
}

// A settings change whose COMMIT failed after its mirror write, and whose
// repair failed too, leaves Redis mirroring values PostgreSQL never took (so
// does an old dump restored). A cache PUT does not rewrite an existing mirror
// (it would rewind a change committed after the request read PostgreSQL);
// a PUT that finds the mirror differing from what it read rewrites it from
// PostgreSQL's row instead, under the row's lock. A PUT the stale, lower
// mirrored quota refuses answers 409 cache_quota_exceeded, and the same PUT
// then succeeds.
func TestProjectCachePutRepairsAStaleMirror(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	h.putKV(p, "first", "1", 60) // creates the mirror from PostgreSQL's row
	if err := h.admin.HSet(ctx, p.keys.Meta(), "paused", 1).Err(); err != nil {
		t.Fatal(err)
	}
	h.putKV(p, "second", "2", 60)
	if v := h.admin.HGet(ctx, p.keys.Meta(), "paused").Val(); v != "0" {
		t.Fatalf("mirrored paused after a PUT found it stale: %s, PostgreSQL holds false", v)
	}

	if err := h.admin.HSet(ctx, p.keys.Meta(), "quota", 16).Err(); err != nil {
		t.Fatal(err)
	}
	body := `{"key":"k","type":"string","value":"` + strings.Repeat("v", 100) + `"}`
	code, b := h.put(p.write, p, body)
	wantError(t, code, b, 409, "cache_quota_exceeded")
	if q := h.admin.HGet(ctx, p.keys.Meta(), "quota").Val(); q != "1048576" {
		t.Fatalf("mirrored quota after the refusal: %s, PostgreSQL holds 1048576", q)
	}
	if code, b := h.put(p.write, p, body); code != 201 {
		t.Fatalf("the same PUT after the repair: %d %s", code, b)
	}
}

// The repair a cache PUT runs when it found the mirror differing is best
// effort and bounded: with the project's row held by another transaction,
// the PUT, whose entry is written, answers within the repair's second
// instead of waiting for the row (the repair ran on the pool without a
// budget, and held the answer until the lock's holder finished).
func TestProjectCachePutRepairDoesNotWaitForAHeldRow(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	h.putKV(p, "first", "1", 60) // creates the mirror
	if err := h.admin.HSet(ctx, p.keys.Meta(), "paused", 1).Err(); err != nil {
		t.Fatal(err)
	}
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE", p.id); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, b := h.put(p.write, p, `{"key":"second","type":"string","value":"2"}`)
	took := time.Since(start)
	if code != 201 {
		t.Fatalf("PUT while the row is held: %d %s", code, b)
	}
	if took > 3*time.Second {
		t.Fatalf("the PUT waited %v for its best-effort mirror repair behind a held row (the repair takes at most 1 s)", took)
	}
}
