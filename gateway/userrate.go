package gateway

import (
	"sync"
	"time"
)

// userHandshakes is a token bucket per user for the handshakes this
// instance admits: Config.UserHandshakeRate a second, at most
// Config.UserHandshakeBurst at once. The per-user connection cap bounds
// how many sockets a user holds, not how fast they come and go: without
// this, one valid token in a connect-and-close loop makes the instance
// redo the handshake's Redis and PostgreSQL work as fast as it can
// (presence registration and removal, the user's online transition), at
// the cost of every other user's handshakes. A bucket is kept as the time
// it is full again, as the inbound frame bucket is (takeToken).
//
// The map forgets users whose bucket is full again: it is kept in two
// generations swapped every span (the time an empty bucket takes to fill),
// and an entry untouched for a whole generation is full. Safe for
// concurrent use.
type userHandshakes struct {
	per   time.Duration // one token
	burst int
	span  time.Duration // an empty bucket's time to fill: burst × per

	mu      sync.Mutex
	cur     map[string]time.Duration // user → when the bucket is full again (sinceStart)
	old     map[string]time.Duration
	swapped time.Duration
}

// maxBucketSpan bounds an empty bucket's time to fill (burst × per): the
// bucket's times, on sinceStart's clock, stay far from a duration's range
// whatever the rate and burst. A bucket that fills in no less than ten
// years is one no user empties anyway.
const maxBucketSpan = 10 * 365 * 24 * time.Hour

func newUserHandshakes(rate float64, burst int) *userHandshakes {
	per, burst := bucketShape(rate, burst)
	return &userHandshakes{per: per, burst: burst, span: time.Duration(burst) * per,
		cur: map[string]time.Duration{}, old: map[string]time.Duration{}, swapped: sinceStart()}
}

// bucketShape is the token period of rate a second and the burst, both
// within maxBucketSpan (computed in floating point, so a tiny rate or a
// huge burst cannot overflow): per at least 1ns and at most maxBucketSpan,
// burst at least 1 and burst × per at most maxBucketSpan.
func bucketShape(rate float64, burst int) (time.Duration, int) {
	per := maxBucketSpan
	if p := float64(time.Second) / rate; rate > 0 && p < float64(maxBucketSpan) { // NaN, 0 and below keep the longest
		per = max(time.Duration(p), 1)
	}
	burst = max(burst, 1)
	if float64(burst)*float64(per) > float64(maxBucketSpan) {
		burst = max(int(maxBucketSpan/per), 1)
	}
	return per, burst
}

// take spends one of the user's tokens; when none is left it returns false
// and how long until there is one.
func (u *userHandshakes) take(userID string) (wait time.Duration, ok bool) {
	now := sinceStart()
	u.mu.Lock()
	defer u.mu.Unlock()
	if now-u.swapped >= u.span {
		clear(u.old)
		u.old, u.cur, u.swapped = u.cur, u.old, now
	}
	full, found := u.cur[userID]
	if !found {
		if full, found = u.old[userID]; found {
			delete(u.old, userID)
		}
	}
	wait, ok = takeToken(&full, now, u.per, u.burst)
	if ok || found {
		u.cur[userID] = full
	}
	return wait, ok
}
