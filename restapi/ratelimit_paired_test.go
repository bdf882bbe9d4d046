package restapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/han-app/gateway/ratelimit"
)

// The send route's limit goes to Redis together with the idempotency
// reserve, and still decides first: a send over the limit is 429 whatever
// else is wrong with it, leaves no idempotency lock behind, and stores
// nothing; a send refused for its body still counts against the limit.
func TestHTTPSendLimitDecidesBeforeTheReserve(t *testing.T) {
	base := newHarness(t)
	const label = "POST /v1/dialogs/{id}/messages"
	w := 62 * time.Second // a window of this test's own
	policy := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, Rules: []ratelimit.Rule{userRule(2, w)}}
	l := newLimited(t, base, nil, map[string]ratelimit.Policy{label: policy}, 0)
	alice, aTok := base.user()
	bob, _ := base.user()
	d := base.dialog(aTok, bob)
	path := "/v1/dialogs/" + d.ID + "/messages"

	// Refused for its body (400), yet counted: one of two left.
	code, b, _ := l.doH(aTok, "POST", path, `{"body":""}`, idemKey())
	wantError(t, code, b, 400, "invalid_body")
	key := idemKey()
	code, b, hdr := l.doH(aTok, "POST", path, `{"body":"first"}`, key)
	if code != 201 || hdr.Get("RateLimit") == "" {
		t.Fatalf("first send: %d %s, RateLimit %q", code, b, hdr.Get("RateLimit"))
	}

	ctx := context.Background()
	ad := env.Redis.AdminClient(0) // KEYS is denied to api_backend
	defer ad.Close()
	locks := func() int { return len(ad.Keys(ctx, "han:api:idemlock:{msg_send:"+alice+":*").Val()) }
	records := func() int { return len(ad.Keys(ctx, "han:api:idem:{msg_send:"+alice+":*").Val()) }
	// The complete that releases the lock is not waited for by the
	// response (a retry meeting the lock is answered from PostgreSQL): it
	// lands shortly after.
	for deadline := time.Now().Add(5 * time.Second); locks() != 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n, m := locks(), records(); n != 0 || m != 1 {
		t.Fatalf("after the first send: %d locks, %d records", n, m)
	}
	for _, c := range []struct {
		name, body string
		key        map[string]string
	}{
		{"a new send", `{"body":"second"}`, idemKey()},
		{"an invalid body", `{"body":""}`, idemKey()},
		{"no key", `{"body":"second"}`, nil},
		{"a replay of the first send", `{"body":"first"}`, key},
	} {
		code, b, hdr := l.doH(aTok, "POST", path, c.body, c.key)
		wantError(t, code, b, http.StatusTooManyRequests, "rate_limited")
		if hdr.Get("Retry-After") == "" {
			t.Fatalf("%s: 429 without Retry-After", c.name)
		}
		if n, m := locks(), records(); n != 0 || m != 1 {
			t.Fatalf("%s over the limit left %d locks, %d records", c.name, n, m)
		}
	}
	var n int
	if err := base.pool.QueryRow(ctx, "SELECT count(*) FROM messages WHERE dialog_id = $1", d.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d messages stored (%v), want the first only", n, err)
	}
}
