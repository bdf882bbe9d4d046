package restapi

import (
	"context"
	"net/http"
	"time"

	"github.com/gorilla/mux"
)

// RealtimeGateway is the realtime side the REST API serves and calls
// (implemented by gateway.Service).
type RealtimeGateway interface {
	// Handler serves GET /v1/realtime (it authenticates by ticket or bearer
	// itself).
	Handler() http.Handler
	// IssueTicket's tokenExpires is the exp of the caller's token: the
	// socket opened with the ticket ends with that token.
	IssueTicket(ctx context.Context, userID string, tokenExpires time.Time) (ticket string, expiresAt time.Time, err error)
	OnlineConnections(ctx context.Context, userID string) (int, error)
	// PubSubHealthy feeds /readyz: false turns it "degraded".
	PubSubHealthy() bool
}

// realtimeRoutes mounts GET /v1/realtime on the root router, before the
// /v1 user subrouter that requires a bearer token, and HEAD like every
// route that reads. A HEAD is never a handshake: it is answered as a GET
// without the upgrade headers (426 with Upgrade: websocket), whatever
// headers it carries.
func (s *Server) realtimeRoutes(r *mux.Router) {
	if s.gw != nil {
		r.Handle(RealtimePath, s.gw.Handler()).Methods(http.MethodGet)
		r.Handle(RealtimePath, noHandshake(s.gw.Handler())).Methods(http.MethodHead)
	}
}

// noHandshake serves r through h without the headers that ask for a
// WebSocket upgrade.
func noHandshake(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.Clone(r.Context())
		r.Header.Del("Connection")
		r.Header.Del("Upgrade")
		h.ServeHTTP(w, r)
	})
}

// realtimeFirst serves GET /v1/realtime without the router: a connect
// storm is thousands of upgrades a second, and the router tries its
// routes' regular expressions in turn (≈ 10 % of a handshake's CPU, the
// goroutine's stack growth included). The route is still labelled
// /v1/realtime in the log and metrics; anything else, and any other
// method on that path, goes to the router.
func (s *Server) realtimeFirst(router http.Handler) http.Handler {
	if s.gw == nil {
		return router
	}
	upgrade := s.gw.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != RealtimePath {
			router.ServeHTTP(w, r)
			return
		}
		if h, ok := r.Context().Value(ctxRouteHolder).(*string); ok {
			*h = RealtimePath
		}
		upgrade.ServeHTTP(w, r)
	})
}

// RealtimePath is the WebSocket endpoint.
const RealtimePath = "/v1/realtime"

// realtimeUserRoutes adds the ticket and presence endpoints (relative to /v1).
func (s *Server) realtimeUserRoutes(user *mux.Router) {
	if s.gw != nil {
		user.HandleFunc("/realtime/tickets", s.handle(s.issueTicket)).Methods(http.MethodPost)
		user.HandleFunc("/users/{id}/presence", s.handle(s.userPresence)).Methods(readMethods...)
	}
}

type ticketDTO struct {
	Ticket    string `json:"ticket"`
	ExpiresAt int64  `json:"expiresAt"`
}

// issueTicket: POST /v1/realtime/tickets → 201 {ticket, expiresAt}. The
// ticket is good for one WebSocket connection within 30 s, and that
// connection ends when the caller's token expires; Redis DB1 down → 503
// redis_unavailable.
func (s *Server) issueTicket(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	t, exp, err := s.gw.IssueTicket(r.Context(), p.UserID, p.Expires)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, ticketDTO{Ticket: t, ExpiresAt: exp.UnixMilli()})
	return nil
}

type presenceDTO struct {
	Online      bool   `json:"online"`
	Connections int    `json:"connections"`
	LastSeenAt  *int64 `json:"lastSeenAt"`
}

// userPresence: GET /v1/users/{id}/presence → {online, connections,
// lastSeenAt}. Visible to the user and to users sharing a dialog with them
// (anyone else: 404 user_not_found). lastSeenAt is the end of the user's
// latest connection, persisted in PostgreSQL (null before the first).
func (s *Server) userPresence(w http.ResponseWriter, r *http.Request) error {
	target, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	lastSeen, err := s.store.PresenceVisible(r.Context(), principal(r).UserID, target)
	if err != nil {
		return err
	}
	n, err := s.gw.OnlineConnections(r.Context(), target)
	if err != nil {
		return err
	}
	dto := presenceDTO{Online: n > 0, Connections: n}
	if lastSeen != nil {
		ms := lastSeen.UnixMilli()
		dto.LastSeenAt = &ms
	}
	writeJSON(w, http.StatusOK, dto)
	return nil
}
