package auth

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// DevClaims describes a token MintDevToken signs.
type DevClaims struct {
	Subject string // a UUID; written in canonical lower case
	Kind    Kind   // zero value: no typ claim (a user token)
	Service string // svc claim; zero value: none
	// Issuer and Audience are written when non-empty.
	Issuer, Audience string
	// TTL sets exp = now + TTL. Zero value means 1h; a negative TTL mints an
	// already expired token (tests).
	TTL time.Duration
	// KeyID is the kid header. Zero value: none.
	KeyID string
}

const defaultDevTTL = time.Hour

// MintDevToken signs an HS256 token (used by `hanctl token`, the demo seed and
// tests). It refuses what a Verifier would reject anyway: a secret under 32
// bytes, a subject that is not a UUID, an unknown kind, an invalid svc.
func MintDevToken(secret []byte, c DevClaims) (string, error) {
	if len(secret) < minHS256SecretBytes {
		return "", fmt.Errorf("auth: dev token secret must be at least %d bytes", minHS256SecretBytes)
	}
	sub, ok := canonicalUUID(c.Subject)
	if !ok {
		return "", errors.New("auth: dev token subject must be a non-nil UUID")
	}
	now := time.Now()
	ttl := c.TTL
	if ttl == 0 {
		ttl = defaultDevTTL
	}
	mc := jwt.MapClaims{
		"sub": sub,
		"iat": now.Unix(),
		"exp": now.Add(ttl).Unix(),
	}
	switch c.Kind {
	case "":
	case KindUser, KindService:
		mc["typ"] = string(c.Kind)
	default:
		return "", errors.New("auth: dev token kind must be user or service")
	}
	if c.Service != "" {
		if !validService(c.Service) {
			return "", errors.New("auth: dev token service must be 1..64 characters of [A-Za-z0-9._-]")
		}
		mc["svc"] = c.Service
	}
	if c.Issuer != "" {
		mc["iss"] = c.Issuer
	}
	if c.Audience != "" {
		mc["aud"] = c.Audience
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, mc)
	if c.KeyID != "" {
		tok.Header["kid"] = c.KeyID
	}
	s, err := tok.SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("auth: sign dev token: %w", err)
	}
	return s, nil
}
