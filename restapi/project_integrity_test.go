package restapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/project"
)

func rawB64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// A listing cursor is opaque, but a client can forge one. The largest
// possible stream id has the form of a message id, yet no message has it
// and as an exclusive start it has no successor (Redis refuses the range):
// it is 400 invalid_cursor on both listings, never a 5xx that counts as a
// Redis outage.
func TestListingCursorOfTheLargestIDIsInvalid(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "events")
	sub := h.qSub(p, top.ID, "s")
	h.qPublish(p, top.ID, "e1", `{"a":1}`)
	maxID := "18446744073709551615-18446744073709551615"
	before := h.dependencyErrors()
	for _, path := range []string{
		p.path("/topics/" + top.ID + "/messages?cursor=" + rawB64(maxID)),
		p.path("/subscriptions/" + sub.ID + "/receipts?cursor=" + rawB64(maxID)),
	} {
		code, b := h.do(p.read, "GET", path, "")
		wantError(t, code, b, 400, "invalid_cursor")
	}
	if after := h.dependencyErrors(); after != before {
		t.Fatalf("dependency errors counted: before [%s], after [%s]", before, after)
	}
}

// ddInvariant returns the project's dd counter and the sum of the bytes
// its dedupe records hold (the counter must equal the sum).
func ddInvariant(t *testing.T, h *qHarness, p testProject) (counter, sum int64) {
	t.Helper()
	ctx := context.Background()
	c, err := h.admin.HGet(ctx, p.keys.Budget(), "dd").Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	recs, err := h.admin.HGetAll(ctx, p.keys.Dedupe()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range recs {
		var r struct {
			B int64 `json:"b"`
		}
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		sum += r.B
	}
	return c, sum
}

// The project budget's dedupe counter is the sum of the bytes its dedupe
// records hold. A producer that republishes an identity whose record has
// expired, but is beyond the expired records one publish purges (at most
// 256), gets a new message whose record replaces the old one: the old
// record's bytes leave the counter with it. Otherwise each such retry would
// leak its bytes from the budget for good, until publishes failed with
// budget_exhausted.
func TestRepublishAfterTheWindowKeepsTheDedupeCounterExact(t *testing.T) {
	h := newQueueHarness(t, project.QueueConfig{DedupeWindow: 3 * time.Second}, nil)
	p := h.project()
	top := h.qTopic(p, "events")
	var last msgResp
	for i := range 300 {
		last = h.qPublish(p, top.ID, fmt.Sprintf("evt-%03d", i), `{"a":1}`)
	}
	if c, s := ddInvariant(t, h, p); c != s {
		t.Fatalf("before: dd counter %d, records hold %d", c, s)
	}
	h.waitRedisPast(last.PublishedAt + 3000)
	// The retry of the last event of the burst, after the window.
	code, b := h.qPublishRaw(p, top.ID, "producer-1", "evt-299", `{"a":1}`)
	if code != 201 {
		t.Fatalf("republish: %d %s", code, b)
	}
	c, s := ddInvariant(t, h, p)
	if c != s {
		t.Errorf("after the republish: dd counter %d, the dedupe records hold %d: %d bytes leaked", c, s, c-s)
	}
	// Once every old record has expired and been purged, the counter holds
	// exactly the new records.
	h.waitRedisPast(h.redisNow() + 3100)
	for i := range 3 {
		h.qPublish(p, top.ID, fmt.Sprintf("late-%d", i), `{"a":1}`)
	}
	h.waitRedisPast(h.redisNow() + 3100)
	for i := range 3 {
		h.qPublish(p, top.ID, fmt.Sprintf("later-%d", i), `{"a":1}`)
	}
	c, s = ddInvariant(t, h, p)
	if snap := h.qSnap(p); c != s || snap.Budget.DedupeBytes != s {
		t.Errorf("after the purge: dd counter %d, snapshot dedupeBytes %d, the dedupe records hold %d", c, snap.Budget.DedupeBytes, s)
	}
}

// The cache's metadata HASH holds its write sequence as a number. One that
// is not a number is data the service did not write: every cache call
// answers 503 data_state_invalid and writes nothing, as for any other
// inconsistency — not redis_unavailable, which would read as an outage.
func TestCacheMetaWithANonNumericSeqIsDataStateInvalid(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	h.putKV(p, "a", "1", 60)
	ctx := context.Background()
	if err := h.admin.HSet(ctx, p.keys.Meta(), "seq", "not-a-number").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, body string }{
		{"PUT", p.path("/cache"), `{"key":"b","type":"string","value":"2"}`},
		{"DELETE", p.path("/cache?key=a"), ""},
		{"GET", p.path("/cache"), ""},
		{"GET", p.path(""), ""},
	} {
		code, b := h.do(p.write, c.method, c.path, c.body)
		if code != 503 || string(b) != `{"error":"data_state_invalid"}` {
			t.Errorf("%s %s: got %d %s, want 503 data_state_invalid", c.method, c.path, code, b)
		}
	}
	if n := h.admin.ZCard(ctx, p.keys.CacheIndex()).Val(); n != 1 {
		t.Fatalf("the cache index holds %d keys after the refused calls, want the one written before", n)
	}
}

// The cache's sizes HASH holds each entry's size as a decimal integer. One
// that is not is data the service did not write: a PUT or DELETE that would
// read it answers 503 data_state_invalid and writes nothing — not
// redis_unavailable after it has already removed the entry or forgotten
// other expired entries (a script that fails halfway keeps its writes).
func TestCacheUnreadableSizeIsDataStateInvalidWithNothingWritten(t *testing.T) {
	h := newPrjHarness(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		plant func(p testProject)
		req   func(p testProject) (string, string, string)
	}{
		{"delete of the entry", func(p testProject) { h.admin.HSet(ctx, p.keys.CacheSizes(), "k", "abc") },
			func(p testProject) (string, string, string) { return "DELETE", p.path("/cache?key=k"), "" }},
		{"put of the entry", func(p testProject) { h.admin.HSet(ctx, p.keys.CacheSizes(), "k", "1.5") },
			func(p testProject) (string, string, string) {
				return "PUT", p.path("/cache"), `{"key":"k","type":"string","value":"new"}`
			}},
		{"put forgetting expired entries", func(p testProject) {
			// Two entries past their deadline that no write has forgotten
			// yet, the second with an unreadable size.
			h.admin.ZAdd(ctx, p.keys.CacheExpiry(), redis.Z{Score: 1, Member: "gone-1"}, redis.Z{Score: 2, Member: "gone-2"})
			h.admin.HSet(ctx, p.keys.CacheSizes(), "gone-1", "3", "gone-2", "-")
		}, func(p testProject) (string, string, string) {
			return "PUT", p.path("/cache"), `{"key":"fresh","type":"string","value":"new"}`
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			p := h.project()
			h.putKV(p, "k", "v", 600)
			c.plant(p)
			dump := func() string {
				var s string
				for _, k := range h.projectKeys(p) {
					v, _ := h.admin.Dump(ctx, k).Result()
					s += fmt.Sprintf("%s=%x;", k, v)
				}
				return s
			}
			before := dump()
			method, path, body := c.req(p)
			code, b := h.do(p.write, method, path, body)
			wantError(t, code, b, 503, "data_state_invalid")
			if dump() != before {
				t.Fatal("a refused request wrote to Redis")
			}
		})
	}
}

// A listing takes back only the cursors it issues, spelled as it spells
// them: a cache cursor is a write sequence of at least 1 without a leading
// zero, or L and the unpadded base64url of a legacy key with no other
// spelling of the same key (non-zero padding bits, a line break); a message
// or receipt cursor likewise. Any other spelling is 400 invalid_cursor,
// never a page. A limit is a number the client picks: digits in 1..100, a
// leading zero the same number, as on every listing of the API.
func TestListingsRefuseSpellingsTheServerNeverIssues(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "events")
	sub := h.qSub(p, top.ID, "s")
	m := h.qPublish(p, top.ID, "e1", `{"a":1}`)
	h.putKV(p, "k", "v", 600)
	msgs := "/topics/" + top.ID + "/messages"
	rcpts := "/subscriptions/" + sub.ID + "/receipts"
	for _, c := range []struct{ path, code string }{
		{"/cache?cursor=0", "invalid_cursor"},
		{"/cache?cursor=01", "invalid_cursor"},
		{"/cache?cursor=007", "invalid_cursor"},
		{"/cache?cursor=LYR", "invalid_cursor"},    // "a" with a padding bit set
		{"/cache?cursor=LYQ%0A", "invalid_cursor"}, // "a" with a line break
		{"/cache?cursor=LY%0DQ", "invalid_cursor"},
		{msgs + "?cursor=" + rawB64(m.ID) + "%0A", "invalid_cursor"},
		{rcpts + "?cursor=" + rawB64(m.ID) + "%0D%0A", "invalid_cursor"},
		{rcpts + "?limit=00", "invalid_limit"},
		{"/cache?limit=0101", "invalid_limit"},
	} {
		code, b := h.do(p.read, "GET", p.path(c.path), "")
		if code != 400 || string(b) != `{"error":"`+c.code+`"}` {
			t.Errorf("GET %s: %d %s, want 400 %s", c.path, code, b, c.code)
		}
	}
	// The spellings the server issues still page.
	for _, path := range []string{
		"/cache?cursor=1", "/cache?cursor=L" + rawB64("a"), "/cache?cursor=L", "/cache?limit=100", "/cache?limit=0100", msgs + "?limit=010",
		msgs + "?cursor=" + rawB64(m.ID), rcpts + "?cursor=" + rawB64(m.ID) + "&limit=1",
	} {
		if code, b := h.do(p.read, "GET", p.path(path), ""); code != 200 {
			t.Errorf("GET %s: %d %s", path, code, b)
		}
	}
}
