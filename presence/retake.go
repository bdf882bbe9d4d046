package presence

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/store/rds"
)

// Registrations taken back a second time. A handshake whose registration
// got no reply is refused, and its registration taken back at once
// (Disconnect). But a Redis that stalls instead of failing runs the calls
// it already received when it wakes, in no particular order: the
// registration may run after that disconnect, and the refused connection
// would then hold one of the user's slots and show the user online until
// it went stale (ConnTTL). So the gateway also calls DisconnectLater, which
// removes the registration once more, Config.RetakeAfter later and once
// Redis answers. A Disconnect or DisconnectMany whose removal got no answer
// queues it here too, so the socket that closed does not stay registered,
// and its user is not left unannounced, until the connection goes stale.
const (
	// retakeEvery is how often the queue is looked at while it holds
	// entries: the granularity of RetakeAfter and the pause between tries
	// while Redis does not answer.
	retakeEvery = 250 * time.Millisecond
	// retakeMax bounds the queue; past it a registration is left to go
	// stale, and the instance's index to the survivors (Deregister).
	retakeMax = 4096
	// retakeBudget bounds one try.
	retakeBudget = time.Second
)

// retake is one connection to remove again from due on, until its entry
// would be stale anyway.
type retake struct {
	c          Conn
	due, until time.Time
	// unknown: the registration's outcome is unknown (DisconnectLater). If
	// it ran, it may have set the user online with nobody told (its reply
	// was lost, and a connect after it found the user online already).
	unknown bool
}

func newRetakeLoop(p *Presence) *loop.Loop {
	return loop.New(loop.Config{Interval: retakeEvery, Timeout: retakeBudget}, p.retakePass)
}

// DisconnectLater removes c's registration (as DisconnectMany does)
// RetakeAfter from now, retried every retakeEvery while Redis does not
// answer, for at most ConnTTL. It reports false when the queue is full or
// Presence is closed. A connection that never registered is a harmless
// no-op.
//
// Once removed, a user who still has live connections is announced online:
// the registration may have run with its reply lost, setting the user
// online unannounced, and the user's next connect then found the user
// online already and announced nothing. A second announcement of a user
// known online changes nothing for the members.
func (p *Presence) DisconnectLater(c Conn) bool {
	return p.retakeLater([]Conn{c}, true) == 1
}

// retakeLater queues the removal of conns as DisconnectLater does (unknown:
// their registrations' outcome is unknown) and returns how many fit in the
// queue. Those that do not fit stay registered, and listed in this
// instance's index, until they go stale: Deregister is told to leave the
// index to the survivors, whose sweep removes them and announces their
// users offline.
func (p *Presence) retakeLater(conns []Conn, unknown bool) int {
	now := time.Now()
	p.mu.Lock()
	n := 0
	if !p.closed {
		n = min(len(conns), p.retakeCap-len(p.retakes))
	}
	if n < len(conns) {
		p.retakesDropped = true
	}
	for _, c := range conns[:n] {
		p.retakes = append(p.retakes, retake{c: c, due: now.Add(p.cfg.RetakeAfter), until: now.Add(p.cfg.ConnTTL), unknown: unknown})
	}
	p.mu.Unlock()
	if n > 0 {
		p.retakeLoop.Start()
	}
	return n
}

// announceOnline announces online each of users that has live
// connections (see DisconnectLater), stamped with Redis's time of the read
// that found them live, as every transition is (the user's Redis node is
// the one clock of all of the user's transitions).
func (p *Presence) announceOnline(ctx context.Context, users []string) {
	if p.events == nil {
		return
	}
	for _, u := range users {
		if n, at, err := p.online(ctx, u); err == nil && n > 0 && !at.IsZero() {
			p.emit(u, func(ctx context.Context) { p.events.Online(ctx, u, at) })
		}
	}
}

// retakePass removes the queued registrations that fell due and reports
// whether entries still wait. Entries are appended with the same delay and
// lifetime, so the due ones and the expired ones are each a prefix of the
// queue.
func (p *Presence) retakePass(ctx context.Context) bool {
	now := time.Now()
	p.mu.Lock()
	var expired []string // unknown registrations given up: stale by now
	for len(p.retakes) > 0 && now.After(p.retakes[0].until) {
		if r := p.retakes[0]; r.unknown && !slices.Contains(expired, r.c.UserID) {
			expired = append(expired, r.c.UserID)
		}
		p.retakes = p.retakes[1:]
	}
	var batch []Conn
	var unknown []string // users whose registration's outcome was unknown
	for _, r := range p.retakes {
		if r.due.After(now) || len(batch) == drainUsersPerTrip {
			break
		}
		batch = append(batch, r.c)
		if r.unknown && !slices.Contains(unknown, r.c.UserID) {
			unknown = append(unknown, r.c.UserID)
		}
	}
	p.mu.Unlock()
	// A registration whose removal never got through is stale now: its
	// user is announced if live elsewhere, as after a removal.
	p.announceOnline(ctx, expired)
	if len(batch) > 0 {
		if _, _, err := p.disconnectMany(ctx, batch); err == nil {
			p.mu.Lock()
			// Only this loop removes entries, so the batch is still the
			// head of the queue.
			p.retakes = p.retakes[len(batch):]
			p.mu.Unlock()
			// Their index entries go too (a removal that failed left them,
			// and nothing else takes them out while the instance lives),
			// and the offline checks the removal scheduled are listed in
			// their place.
			members := make([]string, len(batch))
			var users []string
			for i, c := range batch {
				members[i] = indexMember(c)
				if !slices.Contains(users, c.UserID) {
					users = append(users, c.UserID)
				}
			}
			if score, err := p.listOffline(ctx, p.rdb, users, members).Int64(); err != nil {
				p.logger.Warn("presence: removing retaken connections' index entries failed", slog.String("kind", rds.Kind(rds.ClassifyRedisError(err))))
			} else {
				p.adopt(users, score)
			}
			p.announceOnline(ctx, unknown)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.retakes) == 0 {
		p.retakes = nil
		return false
	}
	return true
}
