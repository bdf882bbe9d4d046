package gateway

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"
)

// The per-user handshake buckets forget users whose bucket is full again:
// a burst of distinct users does not stay in memory, and a user forgotten
// that way has a full bucket, as it should.
func TestUserHandshakeBucketsForgetFullUsers(t *testing.T) {
	slow := newUserHandshakes(10, 2) // a token every 100 ms
	for range 2 {
		if _, ok := slow.take("user-0"); !ok {
			t.Fatal("a handshake within the burst was refused")
		}
	}
	if wait, ok := slow.take("user-0"); ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("the handshake after the burst: ok %v, wait %v; want refused with a wait of at most one token (100ms)", ok, wait)
	}

	u := newUserHandshakes(1000, 2) // a bucket fills in 2 ms
	for i := range 10000 {
		if _, ok := u.take("user-" + strconv.Itoa(i)); !ok {
			t.Fatalf("user %d refused its first handshake", i)
		}
	}
	time.Sleep(10 * time.Millisecond)
	u.take("someone") // swaps the generations
	time.Sleep(10 * time.Millisecond)
	u.take("someone")
	if n := u.users(); n > 2 {
		t.Fatalf("%d users kept after their buckets filled again, want only the latest", n)
	}
	for range 2 {
		if _, ok := u.take("user-0"); !ok {
			t.Fatal("a forgotten user did not get a full bucket back")
		}
	}
}

// users is how many users the bucket map holds.
func (u *userHandshakes) users() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.cur) + len(u.old)
}

// tenYears is the longest an empty bucket takes to fill, whatever its rate
// and burst.
const tenYears = 10 * 365 * 24 * time.Hour

// A bucket of any rate and burst the hub may be given admits a fresh
// user's first handshake and advises a wait it can keep: burst × the token
// period once overflowed a duration for a huge burst (10,000,000,000) or a
// tiny rate (1e-9 a second), and every handshake of every user was refused
// with a wait of centuries.
func TestUserHandshakeBucketsDoNotOverflow(t *testing.T) {
	for _, c := range []struct {
		rate  float64
		burst int
	}{{1, 10_000_000_000}, {1e-9, 32}, {1e-300, 1}, {1000, math.MaxInt}, {0.001, 1_000_000}} {
		u := newUserHandshakes(c.rate, c.burst)
		if wait, ok := u.take("fresh"); !ok {
			t.Errorf("rate %g burst %d: a fresh user's first handshake refused, wait %v", c.rate, c.burst, wait)
		}
		if u.span <= 0 || u.span > tenYears || u.per <= 0 {
			t.Errorf("rate %g burst %d: token period %v, span %v", c.rate, c.burst, u.per, u.span)
		}
	}
	u := newUserHandshakes(1e-9, 1)
	u.take("user")
	wait, ok := u.take("user")
	if ok || wait <= 0 || wait > tenYears {
		t.Fatalf("the second handshake of a one-token bucket: ok %v, wait %v", ok, wait)
	}
}

// The reconnect advice of a close is at most five minutes however long the
// wait behind it (a user's next handshake token may be far off).
func TestRetryAdviceIsCapped(t *testing.T) {
	h := &Hub{cfg: Config{RetryMin: 500 * time.Millisecond, RetryMax: 5 * time.Second}}
	for _, wait := range []time.Duration{0, time.Second, time.Hour, tenYears, math.MaxInt64} {
		var r struct{ RetryMs int64 }
		if err := json.Unmarshal([]byte(h.retryReasonAfter(wait)), &r); err != nil {
			t.Fatal(err)
		}
		if r.RetryMs < 500 || r.RetryMs > 300_000 {
			t.Errorf("wait %v: retryMs %d, want 500..300000", wait, r.RetryMs)
		}
		if wait <= time.Second && r.RetryMs > 6000 {
			t.Errorf("wait %v: retryMs %d, want the wait plus 0.5–5 s", wait, r.RetryMs)
		}
	}
}
