package gateway

import (
	"log/slog"

	"github.com/han-app/gateway/presence"
)

// closeOverCap closes with 1008 too_many_connections the open sockets
// whose presence refresh the per-user cap refused: survivors swept them
// while this instance looked dead (a long pause), and their users opened
// up to the cap elsewhere meanwhile. They end as a handshake over the cap
// is refused, so no user holds more live connections than the cap. It
// runs on the presence refresh's goroutine and blocks on nothing: each
// close is only asked for (the connection's own goroutines perform it).
func (s *Service) closeOverCap(conns []presence.Conn) {
	want := make(map[string]struct{}, len(conns))
	for _, c := range conns {
		want[c.ConnID] = struct{}{}
	}
	closed := 0
	h := s.hub
	h.mu.RLock()
	for c := range h.conns {
		if _, ok := want[c.id]; ok {
			c.closeWith(ClosePolicy, CloseReasonTooManyConnections)
			closed++
		}
	}
	h.mu.RUnlock()
	if closed > 0 {
		s.logger.Warn("realtime connections closed: their users reached the connection cap while this instance was swept",
			slog.Int("connections", closed))
	}
}
