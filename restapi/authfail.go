package restapi

import (
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/ratelimit"
)

// Defaults of the budget of refused credentials per client address
// (HAN_AUTH_FAIL_BURST, HAN_AUTH_FAIL_RATE) and of the addresses one
// instance keeps a budget for.
const (
	DefaultAuthFailBurst     = 20
	DefaultAuthFailRate      = 1.0
	defaultAuthFailAddresses = 65536
)

// AuthFailConfig is the budget of refused credentials per client address:
// Burst refusals at once, then Rate a second. Zero values mean the
// defaults.
type AuthFailConfig struct {
	Burst int
	Rate  float64
	// MaxAddresses is how many client addresses hold a budget of their own
	// on this instance; the others are not limited (ratelimit.FailBudget).
	MaxAddresses int
}

// initAuthFails builds the budget and its gauge.
func (s *Server) initAuthFails(c AuthFailConfig) {
	burst, rate, n := c.Burst, c.Rate, c.MaxAddresses
	if burst <= 0 {
		burst = DefaultAuthFailBurst
	}
	if rate <= 0 {
		rate = DefaultAuthFailRate
	}
	if n <= 0 {
		n = defaultAuthFailAddresses
	}
	s.authFails = ratelimit.NewFailBudget(burst, rate, n)
	s.metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "han_http_auth_fail_addresses",
		Help: "Client addresses holding a budget of refused credentials (REST requests and WebSocket handshakes) of their own on this instance (at most the cap; addresses beyond it are not limited).",
	}, func() float64 { return float64(s.authFails.Len()) }))
}

// verifyCredential authenticates r on a route that needs a token. The
// client address (ClientAddr; an IPv6 client is its /64) has a budget of
// refused credentials: a request whose token is missing or refused is
// answered 401 and spends one unit, a verified token spends nothing, and
// while the budget is spent every request of the address to such a route
// is answered 429 rate_limited with Retry-After without its token being
// looked at, so a client that repeats forged tokens costs at most the
// budget's signature checks. false: the answer is written.
func (s *Server) verifyCredential(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	subject := clientSubject(s.ClientAddr(r))
	if wait, ok := s.authFails.Allow(subject, time.Now()); !ok {
		s.metrics.authFailures.WithLabelValues("limited").Inc()
		e := *errRateLimited
		e.RetryAfter = int((wait + time.Second - 1) / time.Second)
		writeError(w, &e)
		return auth.Principal{}, false
	}
	result := "missing"
	if tok, ok := auth.BearerToken(r); ok {
		p, err := s.verifier.Verify(r.Context(), tok)
		if err == nil {
			return p, true
		}
		result = "refused"
	}
	s.authFails.Fail(subject, time.Now())
	s.metrics.authFailures.WithLabelValues(result).Inc()
	writeError(w, errUnauthorized)
	return auth.Principal{}, false
}

// clientSubject is what the budget of refused credentials counts a client
// address as: an IPv4 address itself, an IPv6 address its /64 (clientNet),
// and every request without an address one subject (the zero Prefix).
func clientSubject(a netip.Addr) netip.Prefix {
	switch {
	case !a.IsValid():
		return netip.Prefix{}
	case a.Is4():
		return netip.PrefixFrom(a, 32)
	default:
		return netip.PrefixFrom(a, 64).Masked()
	}
}

// CredentialGate is the budget of refused credentials of the REST routes,
// for the WebSocket handshake and the refresh frames of the connections it
// opens (gateway.CredentialGate): the same budget per client address, so
// forged credentials sent by handshake, refresh frame and REST request
// spend one budget.
type CredentialGate struct{ s *Server }

// CredentialGate returns the gate the WebSocket handshake shares.
func (s *Server) CredentialGate() CredentialGate { return CredentialGate{s} }

// Subject is r's client as the budget counts it (clientSubject).
func (g CredentialGate) Subject(r *http.Request) netip.Prefix {
	return clientSubject(g.s.ClientAddr(r))
}

// Allow reports whether subject may have its credential looked at now;
// when not, how long until it may.
func (g CredentialGate) Allow(subject netip.Prefix) (time.Duration, bool) {
	return g.s.authFails.Allow(subject, time.Now())
}

// Refused spends one unit of subject's budget.
func (g CredentialGate) Refused(subject netip.Prefix) {
	g.s.authFails.Fail(subject, time.Now())
}
