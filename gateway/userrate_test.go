package gateway

import (
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
