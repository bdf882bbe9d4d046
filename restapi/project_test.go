package restapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	projectapi "github.com/han-app/gateway/restapi/project"
	"github.com/han-app/gateway/store/project"
)

func TestProjectCacheTTLTable(t *testing.T) {
	h := newPrjHarness(t)
	cases := []struct {
		name    string
		ttl     string // the raw ttlSeconds member; "" = absent
		status  int
		code    string
		seconds int64 // expected TTL of accepted ones
	}{
		{"absent", "", 201, "", 86400},
		{"null", `null`, 400, "cache_no_expiry_unsupported", 0},
		{"zero", `0`, 400, "invalid_cache_ttl", 0},
		{"minus one", `-1`, 400, "invalid_cache_ttl", 0},
		{"minus zero", `-0`, 400, "invalid_cache_ttl", 0},
		{"fraction", `1.5`, 400, "invalid_cache_ttl", 0},
		{"integral fraction", `1.0`, 400, "invalid_cache_ttl", 0},
		{"exponent", `1e3`, 400, "invalid_cache_ttl", 0},
		{"capital exponent", `1E3`, 400, "invalid_cache_ttl", 0},
		{"overflow", `1e400`, 400, "invalid_cache_ttl", 0},
		{"string", `"60"`, 400, "invalid_cache_ttl", 0},
		{"boolean", `true`, 400, "invalid_cache_ttl", 0},
		{"object", `{}`, 400, "invalid_cache_ttl", 0},
		{"array", `[60]`, 400, "invalid_cache_ttl", 0},
		{"NaN literal", `NaN`, 400, "invalid_cache_ttl", 0},
		{"above max", `2592001`, 400, "invalid_cache_ttl", 0},
		{"huge", `99999999999999999999999`, 400, "invalid_cache_ttl", 0},
		{"max", `2592000`, 201, "", 2592000},
		{"one", `1`, 201, "", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			p := h.project()
			body := `{"key":"k","type":"string","value":"v"`
			if c.ttl != "" {
				body += `,"ttlSeconds":` + c.ttl
			}
			body += "}"
			code, b := h.put(p.write, p, body)
			if c.status != 201 {
				wantError(t, code, b, c.status, c.code)
				if keys := h.projectKeys(p); len(keys) != 0 {
					t.Fatalf("a rejected PUT wrote %v", keys)
				}
				return
			}
			if code != 201 {
				t.Fatalf("%d %s", code, b)
			}
			it := decode[cacheItem](t, b)
			pttl := h.admin.PTTL(context.Background(), p.keys.CacheEntry("k")).Val()
			want := time.Duration(c.seconds) * time.Second
			if pttl < want-time.Second || pttl > want {
				t.Fatalf("PTTL %v, want %v (±1s)", pttl, want)
			}
			exp := h.admin.PExpireTime(context.Background(), p.keys.CacheEntry("k")).Val()
			if it.ExpiresAt != exp.Milliseconds() || it.ExpiresAt-*it.UpdatedAt != c.seconds*1000 {
				t.Fatalf("expiresAt %d, physical %d, updatedAt %d", it.ExpiresAt, exp.Milliseconds(), *it.UpdatedAt)
			}
		})
	}
}

func TestProjectCacheKeyAndBodyValidation(t *testing.T) {
	h := newPrjHarness(t)
	key256 := strings.Repeat("é", 128) // 256 bytes of two-byte UTF-8
	cases := []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"empty key", `{"key":"","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"256 bytes multi-byte", `{"key":"` + key256 + `","type":"string","value":"v"}`, 201, ""},
		{"257 bytes", `{"key":"` + key256 + `a","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"control character", `{"key":"a\u0007b","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"raw DEL", "{\"key\":\"a\x7fb\",\"type\":\"string\",\"value\":\"v\"}", 400, "invalid_cache_key"},
		{"C1 control", `{"key":"a\u0085b","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"invalid UTF-8 in key", "{\"key\":\"a\xffb\",\"type\":\"string\",\"value\":\"v\"}", 400, "invalid_cache_key"},
		{"lone surrogate in key", `{"key":"\ud800","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"duplicate key member", `{"key":"a","key":"b","type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"key not a string", `{"key":7,"type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"key missing", `{"type":"string","value":"v"}`, 400, "invalid_cache_key"},
		{"unknown type", `{"key":"a","type":"number","value":"1"}`, 400, "invalid_cache_type"},
		{"type missing", `{"key":"a","value":"1"}`, 400, "invalid_cache_type"},
		{"value not a string", `{"key":"a","type":"json","value":{"x":1}}`, 400, "invalid_cache_value"},
		{"value missing", `{"key":"a","type":"string"}`, 400, "invalid_cache_value"},
		{"invalid JSON text", `{"key":"a","type":"json","value":"{\"x\":"}`, 400, "invalid_cache_value"},
		{"JSON text with duplicate keys", `{"key":"a","type":"json","value":"{\"x\":1,\"x\":2}"}`, 400, "invalid_cache_value"},
		{"invalid UTF-8 in value", "{\"key\":\"a\",\"type\":\"string\",\"value\":\"\xc3\x28\"}", 400, "invalid_cache_value"},
		{"lone surrogate in value", `{"key":"a","type":"string","value":"x\ud800"}`, 400, "invalid_cache_value"},
		{"lone low surrogate in value", `{"key":"a","type":"string","value":"\udc00"}`, 400, "invalid_cache_value"},
		{"duplicate unknown member", `{"key":"a","type":"string","value":"v","x":1,"x":2}`, 400, "invalid_json"},
		{"invalid UTF-8 in an unknown member", "{\"key\":\"a\",\"type\":\"string\",\"value\":\"v\",\"x\":\"\xff\"}", 400, "invalid_json"},
		{"createOnly not a boolean", `{"key":"a","type":"string","value":"v","createOnly":1}`, 400, "invalid_json"},
		{"cut short", `{"key":"a","type":"string","value":"v`, 400, "invalid_json"},
		{"not an object", `["key"]`, 400, "invalid_json"},
		{"trailing data", `{"key":"a","type":"string","value":"v"} x`, 400, "invalid_json"},
		{"empty", ``, 400, "invalid_json"},
		{"valid JSON text", `{"key":"j","type":"json","value":"{\"x\":[1,2,{\"y\":null}]}"}`, 201, ""},
		{"empty string value", `{"key":"s","type":"string","value":""}`, 201, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			p := h.project()
			var code int
			var b []byte
			if c.body == "" {
				code, b, _ = h.doH(p.write, "PUT", p.path("/cache"), "", map[string]string{"Content-Type": "application/json"})
			} else {
				code, b = h.put(p.write, p, c.body)
			}
			if c.status != 201 {
				wantError(t, code, b, c.status, c.code)
				if keys := h.projectKeys(p); len(keys) != 0 {
					t.Fatalf("a rejected PUT wrote %v", keys)
				}
				return
			}
			if code != 201 {
				t.Fatalf("%d %s", code, b)
			}
			it := decode[cacheItem](t, b)
			got := h.list(p.read, p, "")
			if len(got.Items) != 1 || got.Items[0].Key != it.Key || got.Items[0].Value != it.Value || got.Items[0].Type != it.Type {
				t.Fatalf("stored %+v, listed %+v", it, got.Items)
			}
			if it.SizeBytes != int64(len(it.Key)+len(it.Value)) {
				t.Fatalf("sizeBytes %d for %q/%q", it.SizeBytes, it.Key, it.Value)
			}
		})
	}
	t.Run("non-JSON content type", func(t *testing.T) {
		defer h.as(t)()
		p := h.project()
		code, b, _ := h.doH(p.write, "PUT", p.path("/cache"), `{"key":"a","type":"string","value":"v"}`, map[string]string{"Content-Type": "text/plain"})
		wantError(t, code, b, 415, "unsupported_media_type")
	})
}

func TestProjectCacheCreateOnlyIsAtomic(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	const n = 20
	codes := make([]int, n)
	bodies := make([][]byte, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes[i], bodies[i] = h.put(p.write, p, fmt.Sprintf(`{"key":"once","type":"string","value":"v%d","createOnly":true}`, i))
		}()
	}
	close(start)
	wg.Wait()
	created, conflicts := 0, 0
	var winner string
	for i := range n {
		switch {
		case codes[i] == 201:
			created++
			winner = fmt.Sprintf("v%d", i)
		case codes[i] == 409 && string(bodies[i]) == `{"error":"cache_key_exists"}`:
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %s", codes[i], bodies[i])
		}
	}
	if created != 1 || conflicts != n-1 {
		t.Fatalf("%d created, %d conflicts", created, conflicts)
	}
	if got := h.list(p.read, p, ""); len(got.Items) != 1 || got.Items[0].Value != winner {
		t.Fatalf("stored %+v, winner %s", got.Items, winner)
	}
	// Without createOnly the same key is replaced: 200.
	code, b := h.put(p.write, p, `{"key":"once","type":"string","value":"again"}`)
	if code != 200 {
		t.Fatalf("replace: %d %s", code, b)
	}
	code, b = h.put(p.write, p, `{"key":"once","type":"string","value":"x","createOnly":false}`)
	if code != 200 {
		t.Fatalf("createOnly:false replace: %d %s", code, b)
	}
}

func TestProjectCacheExpiryIsPhysicalAndOnlyWritesResetIt(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	ctx := context.Background()
	h.putKV(p, "other", "o", 500)
	otherExp := h.admin.PExpireTime(ctx, p.keys.CacheEntry("other")).Val()

	h.putKV(p, "k", "v1", 100)
	pttl := func() time.Duration { return h.admin.PTTL(ctx, p.keys.CacheEntry("k")).Val() }
	if d := pttl(); d < 99*time.Second || d > 100*time.Second {
		t.Fatalf("PTTL after PUT ttl=100: %v", d)
	}
	exp := h.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val()
	for range 3 {
		got := h.list(p.read, p, "")
		if len(got.Items) != 2 {
			t.Fatalf("listing: %+v", got.Items)
		}
		if code, _ := h.do(p.read, "GET", p.path(""), ""); code != 200 {
			t.Fatalf("snapshot: %d", code)
		}
	}
	if after := h.admin.PExpireTime(ctx, p.keys.CacheEntry("k")).Val(); after != exp {
		t.Fatalf("a read moved the deadline: %v → %v", exp, after)
	}
	// A PUT resets the deadline to the new TTL, longer or shorter, and
	// leaves every other entry's deadline alone.
	h.putKV(p, "k", "v2", 1000)
	if d := pttl(); d < 999*time.Second || d > 1000*time.Second {
		t.Fatalf("PTTL after PUT ttl=1000: %v", d)
	}
	h.putKV(p, "k", "v3", 50)
	if d := pttl(); d < 49*time.Second || d > 50*time.Second {
		t.Fatalf("PTTL after PUT ttl=50: %v", d)
	}
	if got := h.admin.PExpireTime(ctx, p.keys.CacheEntry("other")).Val(); got != otherExp {
		t.Fatalf("another entry's deadline moved: %v → %v", otherExp, got)
	}
	// Every physical entry key is han:prj:{<env>:<project>}:… and has a TTL.
	for _, k := range h.projectKeys(p) {
		if !strings.HasPrefix(k, "han:prj:{"+prjEnv+":"+p.id+"}:") {
			t.Fatalf("key outside the project's hash tag: %s", k)
		}
	}
	if bad := h.entryKeysWithoutTTL(p); len(bad) != 0 {
		t.Fatalf("entries without TTL: %v", bad)
	}
	// An entry is gone at its deadline.
	h.putKV(p, "short", "s", 1)
	testenv.Eventually(t, 5*time.Second, func() bool {
		for _, it := range h.list(p.read, p, "").Items {
			if it.Key == "short" {
				return false
			}
		}
		return true
	}, "an expired entry is still listed")
}

func TestProjectCacheDelete(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	h.putKV(p, "a b/ü", "v", 60)
	code, b := h.do(p.write, "DELETE", p.path("/cache?key=")+"a%20b%2F%C3%BC", "")
	if code != 204 || len(b) != 0 {
		t.Fatalf("delete: %d %s", code, b)
	}
	code, b = h.do(p.write, "DELETE", p.path("/cache?key=")+"a%20b%2F%C3%BC", "")
	wantError(t, code, b, 404, "cache_key_not_found")
	for _, q := range []string{"", "?key=", "?key=%FF", "?key=a%07", "?key=a&key=b", "?key=" + strings.Repeat("x", 257)} {
		code, b = h.do(p.write, "DELETE", p.path("/cache")+q, "")
		wantError(t, code, b, 400, "invalid_cache_key")
	}
	if got := h.list(p.read, p, ""); len(got.Items) != 0 {
		t.Fatalf("listed after delete: %+v", got.Items)
	}
	if keys := h.projectKeys(p); len(keys) != 1 || keys[0] != p.keys.Meta() {
		t.Fatalf("after deleting the only entry only metadata remains, got %v", keys)
	}
}

func TestProjectBodyLimit(t *testing.T) {
	h := newPrjHarnessSlowRedis(t) // a 16 MiB value is written below
	p := h.project()
	const over = 17 << 20
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			defer h.as(t)()
			body := &countingReader{left: over}
			var rd io.Reader = body
			if chunked {
				rd = io.NopCloser(body)
			}
			req, _ := http.NewRequest("PUT", h.srv.URL+p.path("/cache"), rd)
			if chunked {
				req.ContentLength = -1
			} else {
				req.ContentLength = over
			}
			req.Header.Set("Authorization", "Bearer "+p.write)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			wantError(t, resp.StatusCode, b, 413, "payload_too_large")
			// The server stops at the limit (declared: before reading at
			// all); the rest would sit in socket buffers, far below 17 MiB.
			if !chunked && body.read.Load() > 8<<20 {
				t.Fatalf("client sent %d bytes of a declared 17 MiB body before the refusal", body.read.Load())
			}
		})
	}
	t.Run("exactly the limit is parsed", func(t *testing.T) {
		defer h.as(t)()
		if code, b := h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":16777216}`); code != 200 {
			t.Fatalf("raise quota: %d %s", code, b)
		}
		head, tail := `{"key":"big","type":"string","value":"`, `"}`
		// value = plain 'a's and "\u0041" escapes (6 body bytes each for one
		// value byte) so the body is exactly the limit and the item exactly
		// the 16 MiB quota.
		room := restapi.ProjectBodyLimit - len(head) - len(tail)
		valueLen := 16<<20 - len("big")
		escapes := (room - valueLen) / 5
		plain := valueLen - escapes
		pad := room - plain - 6*escapes // absorbed by JSON whitespace after the value
		if pad < 0 || escapes < 0 {
			t.Fatalf("bad arithmetic: %d %d", pad, escapes)
		}
		var sb strings.Builder
		sb.Grow(restapi.ProjectBodyLimit)
		sb.WriteString(head)
		sb.WriteString(strings.Repeat("a", plain))
		sb.WriteString(strings.Repeat(`\u0041`, escapes))
		sb.WriteString(`"`)
		sb.WriteString(strings.Repeat(" ", pad))
		sb.WriteString("}")
		if sb.Len() != restapi.ProjectBodyLimit {
			t.Fatalf("body is %d bytes, want %d", sb.Len(), restapi.ProjectBodyLimit)
		}
		code, b := h.put(p.write, p, sb.String())
		if code != 201 {
			if len(b) > 200 {
				b = b[:200]
			}
			t.Fatalf("a body of exactly the limit: %d %s", code, b)
		}
		it := decode[cacheItem](t, b)
		if it.SizeBytes != 16<<20 || len(it.Value) != valueLen || !strings.HasSuffix(it.Value, "AAA") {
			t.Fatalf("stored %d bytes", it.SizeBytes)
		}
		// One byte over the quota is refused before any write.
		code, b = h.put(p.write, p, `{"key":"big2","type":"string","value":"`+strings.Repeat("a", 16<<20-3)+`"}`)
		wantError(t, code, b, 409, "cache_quota_exceeded")
	})
}

// Every route that reads only a few short members takes a body of at most
// projectapi.SmallBodyLimit bytes (413 payload_too_large past it, the
// declared length refused before reading): a body of exactly the limit is
// read, one byte more is refused. A 16 MiB claim of ignored members is
// therefore refused unread instead of being parsed.
func TestProjectSmallBodyLimit(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "t")
	sub := h.qSub(p, top.ID, "s")
	const limit = projectapi.SmallBodyLimit
	for _, c := range []struct {
		name, method, path, body string
		status                   int
	}{
		{"settings", "PUT", "/settings", `{"deliveryPaused":false}`, 200},
		{"topic create", "POST", "/topics", `{"name":"t-%d"}`, 201},
		{"subscription create", "POST", "/subscriptions", `{"topicId":"` + top.ID + `","name":"s-%d"}`, 201},
		{"subscription patch", "PATCH", "/subscriptions/" + sub.ID, `{"status":"online"}`, 200},
		{"trim", "POST", "/topics/" + top.ID + "/trim", `{}`, 200},
		{"claim", "POST", "/subscriptions/" + sub.ID + "/claim", `{"count":1}`, 200},
		{"receipt", "POST", "/subscriptions/" + sub.ID + "/receipts", `{"messageId":"1-0","token":"x","status":"processed"}`, 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			for i, size := range []int{limit, limit + 1} {
				body := c.body
				if strings.Contains(body, "%d") {
					body = fmt.Sprintf(body, i)
				}
				body = body[:len(body)-1] + strings.Repeat(" ", size-len(body)) + "}"
				code, b := h.do(p.write, c.method, p.path(c.path), body)
				if size > limit {
					wantError(t, code, b, 413, "payload_too_large")
				} else if code != c.status {
					t.Fatalf("a body of exactly %d bytes: %d %s, want %d", size, code, b, c.status)
				}
			}
		})
	}
	t.Run("16 MiB claim of ignored members", func(t *testing.T) {
		defer h.as(t)()
		var sb strings.Builder
		sb.WriteString(`{"count":1`)
		for i := 0; sb.Len() < 16<<20-100; i++ {
			sb.WriteString(`,"k` + strconv.FormatInt(int64(i), 36) + `":0`)
		}
		sb.WriteString(`}`)
		code, b := h.do(p.write, "POST", p.path("/subscriptions/"+sub.ID+"/claim"), sb.String())
		wantError(t, code, b, 413, "payload_too_large")
	})
}

func TestProjectPermissionsMatrix(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	other := h.project()
	h.putKV(p, "mine", "v", 600)
	h.putKV(other, "theirs", "secret-of-other", 600)
	unknown := ids.New()
	type req struct{ method, path, body string }
	snapshot := req{"GET", "", ""}
	snapshotSlash := req{"GET", "/", ""}
	list := req{"GET", "/cache", ""}
	put := req{"PUT", "/cache", `{"key":"k","type":"string","value":"v"}`}
	del := req{"DELETE", "/cache?key=mine", ""}
	pause := req{"PUT", "/settings", `{"deliveryPaused":false}`}
	quota := req{"PUT", "/settings", `{"cacheQuotaBytes":1048576}`}
	cases := []struct {
		name   string
		tok    func() string
		r      req
		status int
		code   string
	}{
		{"read snapshot", func() string { return p.read }, snapshot, 200, ""},
		{"read snapshot slash", func() string { return p.read }, snapshotSlash, 200, ""},
		{"read list", func() string { return p.read }, list, 200, ""},
		{"read put", func() string { return p.read }, put, 403, "forbidden"},
		{"read delete", func() string { return p.read }, del, 403, "forbidden"},
		{"read pause", func() string { return p.read }, pause, 403, "forbidden"},
		{"read quota", func() string { return p.read }, quota, 403, "forbidden"},
		{"write snapshot", func() string { return p.write }, snapshot, 200, ""},
		{"write list", func() string { return p.write }, list, 200, ""},
		{"write put", func() string { return p.write }, put, 201, ""},
		{"write pause", func() string { return p.write }, pause, 200, ""},
		{"write quota", func() string { return p.write }, quota, 403, "forbidden"},
		{"write delete", func() string { return p.write }, del, 204, ""},
		{"admin put", func() string { return p.admin }, put, 200, ""},
		{"admin pause", func() string { return p.admin }, pause, 200, ""},
		{"admin quota", func() string { return p.admin }, quota, 200, ""},
		{"admin list", func() string { return p.admin }, list, 200, ""},
		{"non-member snapshot", func() string { return p.outsider }, snapshot, 403, "forbidden"},
		{"non-member list", func() string { return p.outsider }, list, 403, "forbidden"},
		{"non-member put", func() string { return p.outsider }, put, 403, "forbidden"},
		{"service token snapshot", func() string { return p.service }, snapshot, 403, "user_session_required"},
		{"service token put", func() string { return p.service }, put, 403, "user_session_required"},
		{"no token", func() string { return "" }, list, 401, "unauthorized"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			code, b := h.do(c.tok(), c.r.method, p.path(c.r.path), c.r.body)
			if c.code != "" {
				wantError(t, code, b, c.status, c.code)
				return
			}
			if code != c.status {
				t.Fatalf("%d %s, want %d", code, b, c.status)
			}
		})
	}
	t.Run("unknown project", func(t *testing.T) {
		defer h.as(t)()
		for _, path := range []string{"/projects/" + unknown + "/redis", "/projects/" + unknown + "/redis/cache", "/projects/not-a-uuid/redis/cache"} {
			code, b := h.do(p.admin, "GET", path, "")
			wantError(t, code, b, 404, "project_not_found")
		}
		code, b := h.do(p.admin, "PUT", "/projects/"+unknown+"/redis/cache", put.body)
		wantError(t, code, b, 404, "project_not_found")
	})
	t.Run("other project's resources", func(t *testing.T) {
		defer h.as(t)()
		// Through this project's path only this project's keys exist: the
		// other project's key, relative or physical, is not found here.
		for _, key := range []string{"theirs", other.keys.CacheEntry("theirs")} {
			code, b := h.do(p.admin, "DELETE", p.path("/cache?key=")+url.QueryEscape(key), "")
			wantError(t, code, b, 404, "cache_key_not_found")
		}
		for _, it := range h.list(p.admin, p, "?search=theirs").Items {
			t.Fatalf("another project's entry is listed here: %+v", it)
		}
		// And the other project's own path refuses a non-member.
		code, b := h.do(p.admin, "GET", other.path("/cache"), "")
		wantError(t, code, b, 403, "forbidden")
		code, b = h.do(p.admin, "DELETE", other.path("/cache?key=theirs"), "")
		wantError(t, code, b, 403, "forbidden")
		if got := h.list(other.read, other, ""); len(got.Items) != 1 || got.Items[0].Value != "secret-of-other" {
			t.Fatalf("the other project's entry changed: %+v", got.Items)
		}
	})
	t.Run("unknown route and method", func(t *testing.T) {
		defer h.as(t)()
		code, b := h.do(p.write, "POST", p.path("/cache"), `{}`)
		wantError(t, code, b, 405, "method_not_allowed")
	})
}

func TestProjectCacheListingPages(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	want := map[string]bool{}
	for i := range 250 {
		key := fmt.Sprintf("item-%03d", i)
		if i%5 == 0 {
			key = fmt.Sprintf("five/%03d", i)
		}
		h.putKV(p, key, "v", 600)
		want[key] = true
	}
	pages := h.listAll(p.read, p, "&limit=100")
	if len(pages) != 3 || len(pages[0]) != 100 || len(pages[1]) != 100 || len(pages[2]) != 50 {
		t.Fatalf("pages of %d/%d/…: %d pages", len(pages[0]), len(pages[1]), len(pages))
	}
	seen := map[string]bool{}
	for _, pg := range pages {
		for _, it := range pg {
			if seen[it.Key] {
				t.Fatalf("%s listed twice", it.Key)
			}
			seen[it.Key] = true
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("listed %d of %d keys", len(seen), len(want))
	}
	// Write order: the listing follows the write sequence.
	if pages[0][0].Key != "five/000" || pages[0][1].Key != "item-001" || pages[2][49].Key != "item-249" {
		t.Fatalf("order: %s %s … %s", pages[0][0].Key, pages[0][1].Key, pages[2][49].Key)
	}
	// Default limit 50.
	if got := h.list(p.read, p, ""); len(got.Items) != 50 || got.NextCursor == nil {
		t.Fatalf("default page: %d items", len(got.Items))
	}
	// prefix and search filter, and paging through a filter.
	byPrefix := 0
	for _, pg := range h.listAll(p.read, p, "&prefix=five/&limit=7") {
		for _, it := range pg {
			if !strings.HasPrefix(it.Key, "five/") {
				t.Fatalf("prefix filter let %s through", it.Key)
			}
			byPrefix++
		}
	}
	if byPrefix != 50 {
		t.Fatalf("prefix five/: %d items, want 50", byPrefix)
	}
	got := h.list(p.read, p, "?search=-12&limit=100")
	var keys []string
	for _, it := range got.Items {
		keys = append(keys, it.Key)
	}
	if strings.Join(keys, ",") != "item-121,item-122,item-123,item-124,item-126,item-127,item-128,item-129" || got.NextCursor != nil {
		t.Fatalf("search -12: %v (next %v)", keys, got.NextCursor)
	}
	if got := h.list(p.read, p, "?prefix=item&search=five"); len(got.Items) != 0 || got.NextCursor != nil {
		t.Fatalf("prefix and search together: %+v", got.Items)
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?limit=-1"} {
		code, b := h.do(p.read, "GET", p.path("/cache")+q, "")
		wantError(t, code, b, 400, "invalid_limit")
	}
	for _, q := range []string{"?cursor=x", "?cursor=-1", "?cursor=L=", "?cursor=L!!", "?cursor=1.5"} {
		code, b := h.do(p.read, "GET", p.path("/cache")+q, "")
		wantError(t, code, b, 400, "invalid_cursor")
	}
	// A cursor past the end is an empty last page.
	if got := h.list(p.read, p, "?cursor=999999"); len(got.Items) != 0 || got.NextCursor != nil {
		t.Fatalf("cursor past the end: %+v", got)
	}
}

func TestProjectCacheListingCapsValueBytes(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	if code, b := h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":16777216}`); code != 200 {
		t.Fatalf("quota: %d %s", code, b)
	}
	// Written through the store (the same script as PUT) to keep the test
	// fast under -race; the listing is what is under test.
	cache := project.NewCache(h.rdb)
	mirror := project.Mirror{CacheQuotaBytes: 16 << 20}
	putDirect := func(key, value string) {
		t.Helper()
		if _, err := cache.Put(context.Background(), p.keys, mirror, project.CachePut{Key: key, Type: "string", Value: value, TTL: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	value := strings.Repeat("x", 100<<10)
	for i := range 300 {
		putDirect(fmt.Sprintf("k%03d", i), value)
	}
	seen := map[string]bool{}
	pages := h.listAll(p.read, p, "&limit=100")
	for i, pg := range pages {
		var bytes int
		for _, it := range pg {
			bytes += len(it.Value)
			if seen[it.Key] || it.Value != value {
				t.Fatalf("page %d: %s repeated or wrong", i, it.Key)
			}
			seen[it.Key] = true
		}
		if bytes > 4<<20 {
			t.Fatalf("page %d holds %d bytes of values, over 4 MiB", i, bytes)
		}
	}
	// 4 MiB / 100 KiB = 40.96: pages of 40 values.
	if len(seen) != 300 || len(pages[0]) != 40 {
		t.Fatalf("%d keys in %d pages, first page %d items", len(seen), len(pages), len(pages[0]))
	}
	// A single value above 4 MiB still lists, alone on its page.
	putDirect("huge", strings.Repeat("h", 5<<20))
	got := h.list(p.read, p, "?prefix=huge")
	if len(got.Items) != 1 || len(got.Items[0].Value) != 5<<20 {
		t.Fatalf("huge item listing: %d items", len(got.Items))
	}
}

func TestProjectSnapshot(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	type snapshot struct {
		ProjectID   string `json:"projectId"`
		Permissions struct {
			Role               string `json:"role"`
			Read, Write, Admin bool
		} `json:"permissions"`
		Cache struct {
			QuotaBytes            int64  `json:"quotaBytes"`
			UsageBytes            int64  `json:"usageBytes"`
			Entries               int64  `json:"entries"`
			LegacyEntries         int64  `json:"legacyEntries"`
			LegacyExpiresAt       *int64 `json:"legacyExpiresAt"`
			LegacyDeadlinePending bool   `json:"legacyDeadlinePending"`
		} `json:"cache"`
		Topics        []any `json:"topics"`
		Subscriptions []any `json:"subscriptions"`
		Budget        struct {
			LimitBytes       int64 `json:"limitBytes"`
			UsedBytes        int64 `json:"usedBytes"`
			ModuleLimitBytes int64 `json:"moduleLimitBytes"`
		} `json:"budget"`
		Runtime struct {
			EvictionPolicy string `json:"evictionPolicy"`
			WritesAllowed  bool   `json:"writesAllowed"`
			DeliveryPaused bool   `json:"deliveryPaused"`
		} `json:"runtime"`
		Limits map[string]int64 `json:"limits"`
	}
	get := func(tok string) snapshot {
		t.Helper()
		code, b := h.do(tok, "GET", p.path("/"), "")
		if code != 200 {
			t.Fatalf("snapshot: %d %s", code, b)
		}
		for _, field := range []string{`"topics":[]`, `"subscriptions":[]`} {
			if !strings.Contains(string(b), field) {
				t.Fatalf("snapshot lacks %s: %s", field, b)
			}
		}
		return decode[snapshot](t, b)
	}
	s := get(p.write)
	if s.ProjectID != p.id || s.Permissions.Role != "write" || !s.Permissions.Read || !s.Permissions.Write || s.Permissions.Admin {
		t.Fatalf("permissions: %+v", s)
	}
	if s.Cache.QuotaBytes != 1<<20 || s.Cache.UsageBytes != 0 || s.Cache.Entries != 0 || s.Cache.LegacyExpiresAt != nil {
		t.Fatalf("cache: %+v", s.Cache)
	}
	if s.Budget.LimitBytes != 2<<20 || s.Budget.UsedBytes != 0 || s.Budget.ModuleLimitBytes != 64<<20 {
		t.Fatalf("budget: %+v", s.Budget)
	}
	if s.Runtime.EvictionPolicy != "noeviction" || !s.Runtime.WritesAllowed || s.Runtime.DeliveryPaused {
		t.Fatalf("runtime: %+v", s.Runtime)
	}
	for name, v := range map[string]int64{"cacheKeyMaxBytes": 256, "cacheTtlMinSeconds": 1, "cacheTtlMaxSeconds": 2592000,
		"cacheTtlDefaultSeconds": 86400, "cachePageMax": 100, "cachePageValueBytes": 4 << 20, "cacheQuotaDefaultBytes": 1 << 20,
		"cacheQuotaMaxBytes": 16 << 20, "bodyMaxBytes": 16<<20 + 64<<10, "smallBodyMaxBytes": 64 << 10, "messageMaxBytes": 16 << 10, "resultMaxBytes": 256,
		"receiptReserveBytes": 4096, "receiptMaxAttempts": 10, "projectBudgetBytes": 2 << 20, "moduleBudgetBytes": 64 << 20,
		"claimCountMin": 1, "claimCountMax": 20, "leaseSeconds": 60, "publishDedupeSeconds": 86400, "legacyGraceSeconds": 30 * 86400} {
		if s.Limits[name] != v {
			t.Errorf("limit %s = %d, want %d", name, s.Limits[name], v)
		}
	}
	a := h.putKV(p, "a", "12345", 600)
	b := h.putKV(p, "bb", "1", 600)
	h.putKV(p, "a", "123", 600) // replacing counts the new size only
	s = get(p.admin)
	if s.Cache.UsageBytes != 4+b.SizeBytes || s.Cache.Entries != 2 || s.Permissions.Role != "admin" || !s.Permissions.Admin {
		t.Fatalf("usage after writes: %+v (first a was %d)", s.Cache, a.SizeBytes)
	}
	// Settings: PostgreSQL is the truth and Redis mirrors it.
	code, body := h.do(p.write, "PUT", p.path("/settings"), `{"deliveryPaused":true}`)
	if code != 200 || string(body) != `{"cacheQuotaBytes":1048576,"deliveryPaused":true}` {
		t.Fatalf("pause: %d %s", code, body)
	}
	code, body = h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":2048}`)
	if code != 200 || string(body) != `{"cacheQuotaBytes":2048,"deliveryPaused":true}` {
		t.Fatalf("quota: %d %s", code, body)
	}
	s = get(p.read)
	if !s.Runtime.DeliveryPaused || s.Cache.QuotaBytes != 2048 || s.Permissions.Write {
		t.Fatalf("after settings: %+v %+v", s.Runtime, s.Cache)
	}
	meta := h.admin.HGetAll(context.Background(), p.keys.Meta()).Val()
	if meta["paused"] != "1" || meta["quota"] != "2048" {
		t.Fatalf("Redis mirror: %v", meta)
	}
	var quota int64
	var paused bool
	if err := h.pool.QueryRow(context.Background(), "SELECT cache_quota_bytes, delivery_paused FROM projects WHERE id=$1", p.id).Scan(&quota, &paused); err != nil || quota != 2048 || !paused {
		t.Fatalf("PostgreSQL: %d %v %v", quota, paused, err)
	}
}

func TestProjectSettingsValidation(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	for _, body := range []string{`{}`, `{"cacheQuotaBytes":1024,"deliveryPaused":true}`, `{"cacheQuotaBytes":0}`,
		`{"cacheQuotaBytes":-1}`, `{"cacheQuotaBytes":1.5}`, `{"cacheQuotaBytes":1e3}`, `{"cacheQuotaBytes":16777217}`,
		`{"cacheQuotaBytes":"1024"}`, `{"cacheQuotaBytes":null}`, `{"deliveryPaused":"true"}`, `{"deliveryPaused":1}`,
		`{"deliveryPaused":null}`, `{"deliveryPaused":true,"deliveryPaused":false}`, "{\"cacheQuotaBytes\":\"\xff\"}", `{"other":1}`} {
		code, b := h.do(p.admin, "PUT", p.path("/settings"), body)
		wantError(t, code, b, 400, "invalid_settings")
	}
	for _, body := range []string{`{"deliveryPaused":true`, `[]`, `{"deliveryPaused":true,"x":1,"x":2}`} {
		code, b := h.do(p.admin, "PUT", p.path("/settings"), body)
		wantError(t, code, b, 400, "invalid_json")
	}
	// The quota caps one item (key + value bytes).
	if code, b := h.do(p.admin, "PUT", p.path("/settings"), `{"cacheQuotaBytes":10}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	code, b := h.put(p.write, p, `{"key":"k","type":"string","value":"0123456789"}`)
	wantError(t, code, b, 409, "cache_quota_exceeded")
	if keys := h.projectKeys(p); len(keys) != 1 || keys[0] != p.keys.Meta() {
		t.Fatalf("a refused PUT wrote %v", keys)
	}
	if code, b := h.put(p.write, p, `{"key":"k","type":"string","value":"012345678"}`); code != 201 {
		t.Fatalf("an item of exactly the quota: %d %s", code, b)
	}
}

func TestProjectEnvIsPartOfThePhysicalKey(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	h.putKV(p, "k{x}:y", "v", 60)
	want := "han:prj:{test:" + p.id + "}:cache:e:k{x}:y"
	if n := h.admin.Exists(context.Background(), want).Val(); n != 1 {
		t.Fatalf("physical key %s missing; project keys: %v", want, h.projectKeys(p))
	}
}

func TestProjectLogsCarryNoValues(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	secret := "value-" + ids.New()
	h.putKV(p, "k", secret, 60)
	h.list(p.read, p, "")
	h.do(p.write, "PUT", p.path("/cache"), `{"key":"k","type":"json","value":"`+secret+`"}`)
	if logs := h.logs.String(); strings.Contains(logs, secret) || strings.Contains(logs, p.write) {
		t.Fatalf("a log line carries a cache value or a token:\n%s", logs)
	}
}
