package auth

// VerifiedHits is how many Verify calls this Verifier answered from its
// verified-token cache.
func (v *Verifier) VerifiedHits() uint64 {
	v.verified.mu.Lock()
	defer v.verified.mu.Unlock()
	return v.verified.hits
}
