package auth

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Kind is the kind of a token, from its typ claim.
type Kind string

// The token kinds, from the typ claim.
const (
	KindUser    Kind = "user"
	KindService Kind = "service"
)

// Principal is the identity a valid token proves.
type Principal struct {
	UserID  string // the sub claim, a UUID in canonical lower-case form
	Kind    Kind   // claim typ; absent means KindUser
	Service string // claim svc of a service token (the calling service's name); may be empty
	// Expires is the exp claim. The token is accepted until Expires plus
	// the Verifier's Leeway; a WebSocket opened with it closes then.
	Expires time.Time
}

var (
	// ErrUnauthorized is wrapped by every token rejection (→ 401 unauthorized).
	ErrUnauthorized = errors.New("auth: unauthorized")
	// ErrNoKeys is returned by NewVerifier when it would have nothing to verify with.
	ErrNoKeys = errors.New("auth: no verification keys configured")
)

// BearerToken extracts the token of an "Authorization: Bearer <token>"
// header; the scheme is matched case-insensitively. A request with no such
// header, several Authorization headers, or an empty token yields false.
func BearerToken(r *http.Request) (string, bool) {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimLeft(tok, " ")
	if tok == "" || strings.ContainsAny(tok, " \t") {
		return "", false
	}
	return tok, true
}

type principalKey struct{}

// WithPrincipal returns a copy of ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the Principal stored by WithPrincipal.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

const nilUUID = "00000000-0000-0000-0000-000000000000"

// canonicalUUID accepts the 8-4-4-4-12 hex form in any letter case and
// returns it in lower case. Version and variant bits are not checked, since
// identity providers issue v1, v4 and v7 ids alike; the nil UUID is refused
// because it is nobody.
func canonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	var b [36]byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			switch {
			case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
			case 'A' <= c && c <= 'F':
				c += 'a' - 'A'
			default:
				return "", false
			}
		}
		b[i] = c
	}
	out := string(b[:])
	if out == nilUUID {
		return "", false
	}
	return out, true
}

// validService reports whether svc may name a calling service: it becomes
// part of Redis key names (han:api:rl:service:<service>:...), so separators
// and control characters are kept out.
func validService(svc string) bool {
	if len(svc) == 0 || len(svc) > 64 {
		return false
	}
	for i := 0; i < len(svc); i++ {
		c := svc[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
