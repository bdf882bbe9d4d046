package projectapi

import (
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store/project"
)

// FuzzParseCachePut: whatever the body, the cache PUT's parsing (members
// with the cache fields' codes, then parseCachePut) either refuses it with a
// 400 or returns a PUT that satisfies every cache PUT rule of
// docs/project-redis-api.md, from a body that is strict JSON.
func FuzzParseCachePut(f *testing.F) {
	for _, s := range []string{
		`{"key":"k","type":"string","value":"v"}`,
		`{"key":"k","type":"json","value":"{\"a\":1}","ttlSeconds":60,"createOnly":true}`,
		`{"key":"k","type":"string","value":"v","ttlSeconds":null}`,
		`{"key":"k","type":"string","value":"v","ttlSeconds":1e3}`,
		`{"key":"k","type":"string","value":"v","ttlSeconds":2592000}`,
		`{"key":"\ud800","type":"string","value":"v"}`,
		"{\"key\":\"\xff\",\"type\":\"string\",\"value\":\"v\"}",
		`{"key":"a","key":"b","type":"string","value":"v"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := members(b, cacheFields)
		var p project.CachePut
		if err == nil {
			p, err = parseCachePut(m)
		}
		if err != nil {
			var e *apierr.Error
			if !errors.As(err, &e) || e.Status != 400 {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		if jsonx.Check(b) != nil {
			t.Fatalf("accepted a body that is not strict JSON: %q", b)
		}
		if !project.ValidCacheKey(p.Key) || (p.Type != "json" && p.Type != "string") {
			t.Fatalf("accepted key %q type %q", p.Key, p.Type)
		}
		if p.TTL < time.Second || p.TTL > project.CacheTTLMaxSeconds*time.Second || p.TTL%time.Second != 0 {
			t.Fatalf("accepted TTL %v", p.TTL)
		}
		if p.Type == "json" && jsonx.Check([]byte(p.Value)) != nil {
			t.Fatalf("accepted invalid JSON text %q", p.Value)
		}
		members, _ := jsonx.TopLevel(b)
		if raw, ok := members["ttlSeconds"]; ok {
			for _, c := range raw {
				if c < '0' || c > '9' {
					t.Fatalf("accepted TTL token %s", raw)
				}
			}
		} else if p.TTL != project.CacheTTLDefaultSeconds*time.Second {
			t.Fatalf("absent TTL became %v", p.TTL)
		}
	})
}
