package auth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// The verified-token cache: a request's bearer token is usually one that
// the same instance verified moments ago (a client sends many requests with
// one token), and verifying it again — base64, JSON, the signature — is
// the largest fixed cost of an authenticated request. A token this
// Verifier accepted is remembered, by the SHA-256 of its exact bytes, with
// the Principal it proved. A remembered token is accepted again only while
//   - the key set it was verified against is still the current one (a JWKS
//     refetch that changes the keys forgets every token, so a removed key
//     stops working at once), and
//   - its exp plus the leeway has not passed, on the Verifier's clock, and
//   - it was verified less than verifiedTTL ago.
//
// Anything else goes through full verification. Only accepted tokens are
// stored, so a stream of forged tokens costs no memory here.
const (
	// verifiedTTL bounds how long one verification is reused.
	verifiedTTL = time.Minute
	// verifiedMax bounds the entries of one generation (two generations
	// are kept: ≈ 2 × 8,192 × ~100 bytes).
	verifiedMax = 8192
)

type verifiedEntry struct {
	p     Principal
	keys  *keySet
	until time.Time
}

// verifiedCache is two generations of remembered tokens: lookups read both
// and promote a hit from the old one; the current one becomes the old one
// when it is full or verifiedTTL old, and the old one is dropped.
type verifiedCache struct {
	mu      sync.Mutex
	cur     map[[sha256.Size]byte]verifiedEntry
	old     map[[sha256.Size]byte]verifiedEntry
	started time.Time // when cur began
	hits    uint64    // lookups answered from the cache (tests)
}

func (c *verifiedCache) get(token string, keys *keySet, now time.Time) (Principal, bool) {
	h := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.cur[h]
	if !ok {
		if e, ok = c.old[h]; ok && len(c.cur) < verifiedMax {
			c.cur[h] = e
		}
	}
	if !ok || e.keys != keys || !now.Before(e.until) {
		return Principal{}, false
	}
	c.hits++
	return e.p, true
}

func (c *verifiedCache) put(token string, p Principal, keys *keySet, now time.Time, leeway time.Duration) {
	until := now.Add(verifiedTTL)
	if exp := p.Expires.Add(leeway); exp.Before(until) {
		until = exp
	}
	h := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || len(c.cur) >= verifiedMax || now.Sub(c.started) >= verifiedTTL {
		c.old, c.cur, c.started = c.cur, make(map[[sha256.Size]byte]verifiedEntry, 64), now
	}
	c.cur[h] = verifiedEntry{p: p, keys: keys, until: until}
}
