package auth

import (
	"math"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// claims is the token body Verify understands: the registered claims, with
// the three times decoded by numericDate, and the kind claims.
type claims struct {
	jwt.RegisteredClaims
	// These hide the embedded fields of the same JSON names (the
	// shallower field wins), so the times never reach jwt.NumericDate's
	// decoder.
	ExpiresAt *numericDate `json:"exp,omitempty"`
	NotBefore *numericDate `json:"nbf,omitempty"`
	IssuedAt  *numericDate `json:"iat,omitempty"`

	Typ *string `json:"typ,omitempty"`
	Svc string  `json:"svc,omitempty"`
}

// GetExpirationTime implements jwt.Claims.
func (c claims) GetExpirationTime() (*jwt.NumericDate, error) { return c.ExpiresAt.jwt(), nil }

// GetNotBefore implements jwt.Claims.
func (c claims) GetNotBefore() (*jwt.NumericDate, error) { return c.NotBefore.jwt(), nil }

// GetIssuedAt implements jwt.Claims.
func (c claims) GetIssuedAt() (*jwt.NumericDate, error) { return c.IssuedAt.jwt(), nil }

// numericDate is a JWT time (seconds since the epoch) decoded as
// jwt.NumericDate decodes it — the same value, the same truncation to
// jwt.TimePrecision, the same refusals — without the nested json.Unmarshal
// into a json.Number that jwt.NumericDate makes for every time of every
// token. In a profile of a reconnect storm, where every handshake brings a
// token never seen before, that nested decoding (with the stack growth it
// set off on the handshake's fresh goroutine) was ≈ 6 % of the gateway's
// CPU.
type numericDate struct{ time.Time }

// UnmarshalJSON implements json.Unmarshaler. A JSON number (the form every
// issuer uses) is parsed here exactly as json.Number.Float64 parses it; any
// other form goes to jwt.NumericDate's own decoder.
func (d *numericDate) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')) {
		if f, err := strconv.ParseFloat(string(b), 64); err == nil {
			round, frac := math.Modf(f)
			d.Time = time.Unix(int64(round), int64(frac*1e9)).Truncate(jwt.TimePrecision)
			return nil
		}
	}
	var n jwt.NumericDate
	if err := n.UnmarshalJSON(b); err != nil {
		return err
	}
	d.Time = n.Time
	return nil
}

func (d *numericDate) jwt() *jwt.NumericDate {
	if d == nil {
		return nil
	}
	return &jwt.NumericDate{Time: d.Time}
}
