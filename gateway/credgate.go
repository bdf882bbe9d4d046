package gateway

import (
	"net/http"
	"time"
)

// CredentialGate is a budget of refused credentials per client, kept by
// the REST API for its own routes (restapi.Server.CredentialGate) and
// shared with the handshake, so a client that alternates REST requests and
// handshakes with forged credentials gets no more verifications than one
// that uses either alone.
//
// A handshake asks Allow before its ticket or token is looked at: while
// the client's budget is spent, the handshake is closed with 1013 and a
// reconnect delay ({"retryMs":n}, the wait plus the usual spread) without
// the ticket being redeemed in Redis or the token's signature checked. A
// handshake refused as unauthorized (no credential, a forged or expired
// token, an unknown or used ticket) spends one unit with Refused. A good
// credential spends nothing.
type CredentialGate interface {
	// Allow reports whether r's client may have its credential looked at
	// now; when not, how long until it may.
	Allow(r *http.Request) (time.Duration, bool)
	// Refused spends one unit of r's client's budget.
	Refused(r *http.Request)
}

// SetCredentialGate makes handshakes use g. It must be called before the
// handler serves; without it handshakes have no such budget.
func (s *Service) SetCredentialGate(g CredentialGate) {
	s.handler.gate = g
}
