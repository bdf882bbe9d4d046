package auth

import "github.com/golang-jwt/jwt/v5"

// VerifiedHits is how many Verify calls this Verifier answered from its
// verified-token cache.
func (v *Verifier) VerifiedHits() uint64 {
	v.verified.mu.Lock()
	defer v.verified.mu.Unlock()
	return v.verified.hits
}

// ReadNumericDate reads b as a time claim of a token the Verifier checks.
func ReadNumericDate(b []byte) (*jwt.NumericDate, error) {
	var d numericDate
	if err := d.UnmarshalJSON(b); err != nil {
		return nil, err
	}
	return d.date(), nil
}
