package gateway

import (
	"net/http"
	"net/netip"
	"time"
)

// CredentialGate is a budget of refused credentials per client, kept by
// the REST API for its own routes (restapi.Server.CredentialGate) and
// shared with the handshake and with the refresh frames of the
// connections it opened, so a client that alternates REST requests,
// handshakes and refresh frames with forged credentials gets no more
// verifications than one that uses any of them alone.
//
// The client is named once, at the handshake (Subject), and a connection
// keeps that name for its refresh frames: an open socket has no request
// of its own to name it again.
//
// A handshake asks Allow before its ticket or token is looked at: while
// the client's budget is spent, the handshake is closed with 1013 and a
// reconnect delay ({"retryMs":n}, the wait plus the usual spread) without
// the ticket being redeemed in Redis or the token's signature checked. A
// handshake refused as unauthorized (no credential, a forged or expired
// token, an unknown or used ticket) spends one unit with Refused. A
// refresh frame asks Allow the same way before its token is verified:
// while the budget is spent it is answered with the error rate_limited
// and a retryMs, and the connection stays open with its current
// credential; a refresh token that fails verification spends one unit. A
// good credential spends nothing.
type CredentialGate interface {
	// Subject names r's client as the budget counts it. Its zero value
	// is a subject too (the gate decides what it counts as).
	Subject(r *http.Request) netip.Prefix
	// Allow reports whether the client subject may have its credential
	// looked at now; when not, how long until it may.
	Allow(subject netip.Prefix) (time.Duration, bool)
	// Refused spends one unit of the client subject's budget.
	Refused(subject netip.Prefix)
}

// SetCredentialGate makes handshakes and refresh frames use g. It must be
// called before the handler serves; without it neither has such a budget.
func (s *Service) SetCredentialGate(g CredentialGate) {
	s.hub.creds = g
}
