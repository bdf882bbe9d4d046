package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// TokenVerifier checks bearer tokens (implemented by auth.Verifier).
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (auth.Principal, error)
	// Leeway is the clock skew allowed on exp: a token is accepted until
	// its exp plus Leeway, and a connection ends then too.
	Leeway() time.Duration
}

// handler serves GET /v1/realtime.
type handler struct {
	s       *Service
	origins map[string]struct{}
}

// ServeHTTP upgrades with subprotocol han.v1, then checks the Origin
// exactly (coder/websocket's own check accepts any same-host Origin and a
// missing one, so it is off), authenticates by one-time ticket or bearer
// token and registers the connection. Refusals after the upgrade are close frames
// with the codes of docs/realtime-protocol.md, because a browser cannot read
// the status of a failed upgrade.
func (hd *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := hd.s
	h := s.hub
	origin := r.Header.Get("Origin")
	ticket := r.URL.Query().Get("ticket")
	token, hasBearer := auth.BearerToken(r)

	hw := &hijackWriter{ResponseWriter: w, sendBuffer: h.cfg.SendBuffer}
	offerExactSubprotocol(r)
	ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{
		Subprotocols:       []string{Subprotocol},
		InsecureSkipVerify: true, // the exact Origin check happens here, not in the library
		OnPingReceived:     pingReceived,
		OnPongReceived:     pongReceived,
	})
	if err != nil {
		h.countReject("handshake")
		return
	}
	end, ok := h.beginHandshake()
	if !ok {
		h.countReject("draining")
		h.countClose(CloseGoingAway)
		h.boundCloseRead(hw.cork)
		_ = ws.Close(CloseGoingAway, h.retryReason())
		return
	}
	defer end()
	refuse := func(code websocket.StatusCode, reason, metric string) {
		end() // the registration, if any, is taken back by now
		h.countReject(metric)
		h.countClose(code)
		// The refused client's reply is bounded like any close
		// handshake's: nothing else limits what it sends now.
		h.boundCloseRead(hw.cork)
		_ = ws.Close(code, reason)
	}
	if ref := hd.admit(origin, ticket, ws.Subprotocol()); ref.metric != "" {
		refuse(ref.code, ref.reason, ref.metric)
		return
	}
	// The client is named once for the budget of refused credentials: the
	// connection keeps the name for its refresh frames.
	var subject *netip.Prefix
	if g := h.creds; g != nil {
		p := g.Subject(r)
		if wait, ok := g.Allow(p); !ok {
			refuse(CloseTryAgainLater, h.retryReasonAfter(wait), "auth_limited")
			return
		}
		subject = &p
	}

	c, expires, budget, ref := hd.register(ws, hw.cork, ticket, token, hasBearer)
	if ref.metric != "" {
		if ref == refuseUnauthorized && subject != nil {
			h.creds.Refused(*subject)
		}
		refuse(ref.code, ref.reason, ref.metric)
		return
	}
	c.credSubject = subject
	if ref := hd.open(c, expires, budget); ref.metric != "" {
		// Registered in presence a moment ago: take it back.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = s.presence.Disconnect(ctx, c.userID, c.id)
		cancel()
		refuse(ref.code, ref.reason, ref.metric)
		return
	}
	// Read on a fresh goroutine and let net/http's handler goroutine (and
	// its grown stack) end: an idle connection then costs two small
	// goroutines.
	go c.readLoop()
}

// handshakeBudget bounds a handshake's work once it is admitted: the
// ticket or token, the presence registration and the confirmation of the
// user's channel together.
const handshakeBudget = 5 * time.Second

// register authenticates the handshake and records its connection in
// presence: the Redis and PostgreSQL work of a handshake, run under an
// admission slot (admission.go); beyond the admission queue's bounds the
// client is refused with 1013 and a reconnect delay. It writes nothing to
// the client but, when the handshake has to queue, the upgrade response (a
// few hundred bytes a fresh socket takes at once), so a client that does
// not read holds no slot. It returns the connection, its credential's exp
// and the end of the handshake's budget.
func (hd *handler) register(ws *websocket.Conn, cork *corkConn, ticket, token string, hasBearer bool) (*conn, time.Time, time.Time, refusal) {
	s := hd.s
	// The upgrade response waits for the hello frame (one write for both)
	// unless the handshake has to queue: then it goes out now, so the
	// client's upgrade completes while it waits.
	if err := s.hub.gate.acquire(cork.sendHead); err != nil {
		metric := "handshake_queue_full"
		if errors.Is(err, errAdmissionWait) {
			metric = "handshake_queue_timeout"
		}
		return nil, time.Time{}, time.Time{}, refusal{CloseTryAgainLater, s.hub.retryReason(), metric}
	}
	defer s.hub.gate.release()
	if s.hub.isDraining() { // began while this handshake waited
		return nil, time.Time{}, time.Time{}, refusal{CloseGoingAway, s.hub.retryReason(), "draining"}
	}
	// The budget of the work starts once it is admitted.
	budget := time.Now().Add(handshakeBudget)
	ctx, cancel := context.WithDeadline(context.Background(), budget)
	defer cancel()
	userID, expires, ref := s.authenticate(ctx, ticket, token, hasBearer)
	if ref.metric != "" {
		return nil, time.Time{}, time.Time{}, ref
	}
	// A ticket redeemed after its issuing token expired opens nothing.
	deadline := expires.Add(s.verifier.Leeway())
	if !time.Now().Before(deadline) {
		return nil, time.Time{}, time.Time{}, refusal{CloseUnauthorized, CloseReasonTokenExpired, CloseReasonTokenExpired}
	}
	// The user's handshakes on this instance are rate-limited before the
	// presence registration, the Redis work that connecting and closing
	// in a loop would repeat.
	if wait, ok := s.hub.users.take(userID); !ok {
		return nil, time.Time{}, time.Time{}, refusal{CloseTryAgainLater, s.hub.retryReasonAfter(wait), "handshake_rate"}
	}
	c := newConn(s.hub, ws, cork, userID, deadline)
	if err := s.presence.Connect(ctx, presence.Conn{UserID: userID, ConnID: c.id}); err != nil {
		if errors.Is(err, presence.ErrTooManyConnections) {
			return nil, time.Time{}, time.Time{}, refusal{ClosePolicy, CloseReasonTooManyConnections, CloseReasonTooManyConnections}
		}
		// DB1 is needed to record presence: refuse new connections while it
		// is out; existing ones keep their local fan-out (docs/degraded-mode.md).
		// The registration may have happened before the failure: take it back
		// (best effort), so it does not hold one of the user's connection slots
		// until it goes stale; and once more a little later, as a Redis that
		// stalled may run it only when it wakes, after this disconnect.
		s.logger.Warn("realtime connection refused: presence unavailable", slog.String("kind", rds.Kind(err)))
		_, _ = s.presence.Disconnect(ctx, userID, c.id)
		s.presence.DisconnectLater(presence.Conn{UserID: userID, ConnID: c.id})
		return nil, time.Time{}, time.Time{}, refuseUnavailable
	}
	return c, expires, budget, refusal{}
}

// open starts a registered connection: it takes the connection's
// reference on its user's channel and, unless the instance holds the
// channel's confirmed subscription already (no Redis work), waits until
// deadline for Redis to confirm it, without an admission slot: the
// SUBSCRIBE travels on the Pub/Sub connection, shared by the handshakes
// that wait together, not on a pool connection. Only then does hello go
// out (Hub.add), so every event published on the user's channel after the
// client got hello reaches it (unless a resync or the connection's end
// says otherwise). A subscription not confirmed in time refuses the
// handshake as an unavailable dependency does (1013). The hello is built
// after that wait, so its serverTime is the clock when it goes out, not
// when the handshake began; expires is the credential's exp.
func (hd *handler) open(c *conn, expires, deadline time.Time) refusal {
	h := hd.s.hub
	ch := pubsub.UserChannel(c.userID)
	if !h.deps.Subscriber.Join(ch) {
		// Bounded by the handshake's budget, and ended by a drain.
		ctx, cancel := context.WithDeadline(h.stopping, deadline)
		err := h.deps.Subscriber.Subscribe(ctx, ch)
		cancel()
		if err != nil {
			if h.stopping.Err() != nil {
				return refusal{CloseGoingAway, h.retryReason(), "draining"}
			}
			hd.s.logger.Warn("realtime connection refused: user channel subscription not confirmed")
			return refusal{CloseTryAgainLater, refuseUnavailable.reason, "pubsub_unavailable"}
		}
	}
	hello := mustJSON(helloFrame{Type: "hello", ConnectionID: c.id, Instance: h.cfg.InstanceID,
		HeartbeatMs: h.cfg.PingInterval.Milliseconds(), ExpiresAt: expires.UnixMilli(), ServerTime: time.Now().UnixMilli()})
	if !h.add(c, hello) {
		h.deps.Subscriber.Unsubscribe(ch)
		return refusal{CloseGoingAway, h.retryReason(), "draining"}
	}
	return refusal{}
}

// refusal is why a handshake ends in a close frame: code and reason go to
// the client, metric names the rejection counted. The zero value refuses
// nothing.
type refusal struct {
	code   websocket.StatusCode
	reason string
	metric string
}

var (
	refuseUnauthorized = refusal{CloseUnauthorized, "unauthorized", "unauthorized"}
	refuseUnavailable  = refusal{CloseTryAgainLater, "try again later", "unavailable"}
)

// offerExactSubprotocol leaves the request offering the subprotocol only
// as exactly Subprotocol, or not at all. The library matches an offer
// without regard to case and agrees to the client's spelling of the first
// match, so a client offering "HAN.V1, han.v1" was agreed "HAN.V1" in the
// 101 and then refused by admit's exact check, although it offered the
// right one.
func offerExactSubprotocol(r *http.Request) {
	const key = "Sec-Websocket-Protocol"
	vals := r.Header[key]
	if len(vals) == 1 && vals[0] == Subprotocol {
		return // the common case, untouched
	}
	for _, v := range vals {
		for p := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(p) == Subprotocol {
				r.Header[key] = []string{Subprotocol}
				return
			}
		}
	}
	delete(r.Header, key)
}

// admit checks what the handshake itself carries (Origin, subprotocol)
// and whether the instance still takes connections.
func (hd *handler) admit(origin, ticket, subprotocol string) refusal {
	_, originAllowed := hd.origins[origin]
	switch {
	case origin != "" && !originAllowed:
		return refusal{ClosePolicy, "origin not allowed", "origin"}
	case ticket != "" && origin == "":
		return refusal{ClosePolicy, "origin required with a ticket", "origin"}
	case subprotocol != Subprotocol:
		return refusal{ClosePolicy, "subprotocol han.v1 required", "subprotocol"}
	case hd.s.hub.isDraining():
		return refusal{CloseGoingAway, hd.s.hub.retryReason(), "draining"}
	}
	return refusal{}
}

// authenticate names the user of a handshake and the exp of its token (or
// of the token that issued the ticket), from the one-time ticket or else the
// bearer token.
func (s *Service) authenticate(ctx context.Context, ticket, token string, hasBearer bool) (string, time.Time, refusal) {
	switch {
	case ticket != "":
		userID, expires, err := s.tickets.Redeem(ctx, ticket)
		if errors.Is(err, ErrTicketInvalid) {
			return "", time.Time{}, refuseUnauthorized
		}
		if err != nil {
			return "", time.Time{}, refuseUnavailable
		}
		return userID, expires, refusal{}
	case hasBearer:
		p, err := s.verifier.Verify(ctx, token)
		if err != nil {
			return "", time.Time{}, refuseUnauthorized
		}
		if p.Kind != auth.KindUser {
			return "", time.Time{}, refusal{CloseForbidden, CloseReasonUserSession, "forbidden"}
		}
		if err := s.store.EnsureUser(ctx, p.UserID); err != nil {
			return "", time.Time{}, refuseUnavailable
		}
		return p.UserID, p.Expires, refusal{}
	default:
		return "", time.Time{}, refuseUnauthorized
	}
}

func (h *Hub) isDraining() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.draining
}
