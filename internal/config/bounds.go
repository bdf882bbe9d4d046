package config

import (
	"net/url"
	"strings"
	"time"
)

// Bounds of values whose arithmetic in the service would overflow, or
// whose effect is no longer what the name says, beyond them.
const (
	// maxLoopInterval is the longest interval of a background loop
	// (HAN_PRESENCE_SWEEP_INTERVAL, HAN_SETTINGS_REFRESH_INTERVAL) and the
	// longest HAN_INSTANCE_LIVENESS_TTL: a day is "rarely" enough, and the
	// loops' jitter and budgets stay far from a duration's range.
	maxLoopInterval = 24 * time.Hour
	// maxBodyTimeout is the longest HAN_HTTP_BODY_TIMEOUT: the base of the
	// body and response deadlines, to which the transfer allowance of the
	// bytes is added.
	maxBodyTimeout = time.Hour
	// The per-user handshake bucket: at least one token every 1000 s, at
	// most 1000 a second, and at most a million at once (a burst that
	// large already means "no limit").
	minUserHandshakeRate  = 0.001
	maxUserHandshakeRate  = 1000
	maxUserHandshakeBurst = 1_000_000
)

// IsName reports whether s is a non-empty name of ASCII letters, digits,
// '.', '_' and '-' only: what HAN_ENV and HAN_INSTANCE_ID may hold. They
// become parts of Redis keys and PostgreSQL scopes, and HAN_ENV switches
// the production guards on: a value with a character outside the set (a
// carriage return from an env file saved with CRLF line ends, a no-break
// space) would read as another name than the one the operator sees.
func IsName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i]) {
			return false
		}
	}
	return true
}

func isNameByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-'
}

// asName turns s into a name IsName takes, each other byte becoming '-'
// (the host name in the default HAN_INSTANCE_ID).
func asName(s string) string {
	b := []byte(s)
	for i := range b {
		if !isNameByte(b[i]) {
			b[i] = '-'
		}
	}
	return string(b)
}

// atAfterHost reports whether u has no user information while an '@'
// follows its host (in the path, the query or the fragment): the sign of a
// password written with a '/', '?' or '#' not percent-encoded, which ends
// the host early. postgres://han:4/secret@db:5432/han reads as host han,
// port 4, and a path holding the rest of the password, which a connection
// error would then print as the database name.
func atAfterHost(u *url.URL) bool {
	return u.User == nil && strings.ContainsRune(u.EscapedPath()+"?"+u.RawQuery+"#"+u.EscapedFragment(), '@')
}

// unencodedPassword is the problem atAfterHost finds, for name.
func unencodedPassword(name string) string {
	return name + ": an '@' follows the host: a password holding '/', '?' or '#' must be percent-encoded (%2F, %3F, %23)"
}
