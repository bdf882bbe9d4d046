package restapi_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
)

// A Redis that stalls instead of failing (a stopped process, a long fork, a
// healed partition) still holds the bytes of the calls that timed out and
// runs them when it wakes: the reserve of a send the client was already
// told failed (503) would then take the key's lock for a request that no
// longer runs, and every retry with that key would get 409
// idempotency_in_progress until the lock's TTL (30 s) ran out. The server
// gives such a lock back as soon as Redis answers again, so the client's
// retry with its key succeeds within a few seconds, and the message exists
// once. Both reserve paths: alone, and in one round trip with the send's
// rate-limit decision.
func TestStalledRedisDoesNotHoldARetriedKey(t *testing.T) {
	const budget = 300 * time.Millisecond
	for _, withLimit := range []bool{false, true} {
		name := "reserve alone"
		if withLimit {
			name = "reserve with the limit"
		}
		t.Run(name, func(t *testing.T) {
			r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, budget)
			var h *harness
			if withLimit {
				base := newHarness(t)
				h = newLimited(t, base, rdb, map[string]ratelimit.Policy{
					"POST /v1/dialogs/{id}/messages": {Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed,
						Rules: []ratelimit.Rule{userRule(1000, time.Minute)}},
				}, budget).harness
			} else {
				h = newIdemHarness(t, idemOpts{rdb: rdb, rt: rt, idem: restapi.IdempotencyConfig{RedisBudget: budget, ProbeInterval: 50 * time.Millisecond}})
			}
			alice, aTok := h.user()
			bob, _ := h.user()
			d := h.dialog(aTok, bob)
			path := "/v1/dialogs/" + d.ID + "/messages"
			if code, b, _ := h.doH(aTok, "POST", path, `{"body":"warm"}`, idemKey()); code != 201 {
				t.Fatalf("%d %s", code, b)
			}

			// Handshaken connections only: a reserve taken from a connection
			// the pool dialled while Redis was stopped never reaches Redis.
			testenv.WarmPool(t, rdb)
			thaw := r.Freeze(t)
			code, b, _ := h.doH(aTok, "POST", path, `{"body":"stalled"}`, keyHdr("stalled"))
			wantError(t, code, b, 503, "redis_unavailable")
			thaw()

			// Well under the lock's 30 s TTL: the retry runs once Redis
			// answers and the lock the stalled call took is given back.
			deadline := time.Now().Add(10 * time.Second)
			for {
				code, b, hdr := h.doH(aTok, "POST", path, `{"body":"stalled"}`, keyHdr("stalled"))
				if code == 201 {
					break
				}
				if code == http.StatusConflict && hdr.Get("Retry-After") == "" {
					t.Fatalf("409 without Retry-After: %s", b)
				}
				if time.Now().After(deadline) {
					t.Fatalf("the retried key did not run within 10 s of Redis waking up: %d %s", code, b)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := h.count("SELECT count(*) FROM messages WHERE sender_id=$1 AND body='stalled'", alice); n != 1 {
				t.Fatalf("%d messages for the retried key, want 1", n)
			}
			// The stalled call's token was given up once Redis answered:
			// its lock released, or marked before the call ran.
			// (Counted by the prober, which may come after the retry when
			// the stalled call held no lock the retry waited for.)
			counted := regexp.MustCompile(`han_idempotency_abandoned_total\{outcome="(released|marked)"\} [1-9]`)
			var m []byte
			testenv.Eventually(t, 5*time.Second, func() bool {
				_, m = h.do("", "GET", "/metrics", "")
				return counted.Match(m)
			}, "no abandoned token counted: %s", stringer(func() string { return grepLines(m, "han_idempotency_abandoned_total") }))
		})
	}
}

// stringer formats as f's result at the time it is printed.
type stringer func() string

func (f stringer) String() string { return f() }

// grepLines is the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
