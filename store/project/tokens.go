package project

import (
	"strings"
	"sync"
)

// tokenSpareMax bounds the unused lease tokens a Queue keeps.
const tokenSpareMax = 256

// tokenPool keeps the fresh lease tokens that claims did not use. A claim
// sends the hashes of as many tokens as it may lease, and most find fewer
// messages (often none); the hashes of the unused ones went to Redis as
// arguments but no receipt stored them, and nobody saw the tokens, so a
// later claim may issue them. Only the tokens of a claim whose reply
// arrived come back: a claim whose reply was lost may have stored them.
// Safe for concurrent use.
type tokenPool struct {
	mu    sync.Mutex
	spare []leaseToken
}

// leaseToken is a lease token and its stored hash (LeaseTokenHash).
type leaseToken struct{ token, hash string }

// take returns n tokens, kept ones first, and their hashes concatenated as
// the claim script takes them.
func (p *tokenPool) take(n int) ([]leaseToken, string) {
	out := make([]leaseToken, n)
	p.mu.Lock()
	got := copy(out, p.spare[max(len(p.spare)-n, 0):])
	clear(p.spare[len(p.spare)-got:])
	p.spare = p.spare[:len(p.spare)-got]
	p.mu.Unlock()
	if got < n {
		tokens, hashes := newLeaseTokens(n - got)
		for i, t := range tokens {
			out[got+i] = leaseToken{token: t, hash: hashes[32*i : 32*i+32]}
		}
	}
	var b strings.Builder
	b.Grow(32 * n)
	for _, t := range out {
		b.WriteString(t.hash)
	}
	return out, b.String()
}

// giveBack keeps the tokens of a claim that were not issued (used[i] false).
func (p *tokenPool) giveBack(tokens []leaseToken, used []bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, t := range tokens {
		if !used[i] && len(p.spare) < tokenSpareMax {
			p.spare = append(p.spare, t)
		}
	}
}
