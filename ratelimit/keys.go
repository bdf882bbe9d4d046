package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"strconv"
	"sync"
	"time"
)

// Every han:api:rl:* key is built here (docs/redis-keys.md):
//
//	han:api:rl:user:<user_id>:<route_hash>:<window>
//	han:api:rl:ip:<ip_hmac>:<route_hash>:<window>
//	han:api:rl:dialog:<dialog_id>:message:<window>
//	han:api:rl:service:<service>:<route_hash>:<window>
//
// <window> is the algorithm's initial and the window in ms ("s10000",
// "f60000", "b10000"), so a policy that changes its algorithm or window
// starts on fresh keys instead of meeting a key of another type or period.
const keyPrefix = "han:api:rl:"

// RouteHash is the route label's segment of a key: 16 hex digits of its
// SHA-256. Labels come from the bounded allow-list (Lookup), so the number of
// hashes is bounded too.
func RouteHash(label string) string {
	if h, ok := routeHashes.Load(label); ok {
		return h.(string)
	}
	sum := sha256.Sum256([]byte(label))
	h := hex.EncodeToString(sum[:8])
	routeHashes.Store(label, h)
	return h
}

// routeHashes memoizes RouteHash: one entry per route label, and labels
// come from the bounded allow-list.
var routeHashes sync.Map

func windowID(a Algorithm, w time.Duration) string {
	return string(a[:1]) + strconv.FormatInt(w.Milliseconds(), 10)
}

// Key is the Redis key of one family's counter for a route. subject is the
// family's identity: user id, IP HMAC, dialog id or service name.
func Key(f Family, subject, routeHash string, a Algorithm, window time.Duration) string {
	if f == FamilyDialog {
		// A dialog's limit covers message sends, whatever the route label.
		return keyPrefix + "dialog:" + subject + ":message:" + windowID(a, window)
	}
	return keyPrefix + string(f) + ":" + subject + ":" + routeHash + ":" + windowID(a, window)
}

// maxJitter bounds the expiry jitter: a tenth of the window, at most 5 s.
func maxJitter(window time.Duration) int64 {
	j := window.Milliseconds() / 10
	if j > 5000 {
		j = 5000
	}
	return j
}

// Jitter is the extra expiry of a key beyond its window, in ms. It spreads
// expirations of keys created together, and it is a function of the key, so
// every call passes the same value and the fixed-window script can recover
// the window end from the key's expiry time.
func Jitter(key string, window time.Duration) int64 {
	m := maxJitter(window)
	if m <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64() % uint64(m+1))
}
