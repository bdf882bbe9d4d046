package presence

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Teardown of many connections at once (a draining instance). A user's
// connections go in one script on the user's hash tag, as the key layout
// requires, but many users' scripts share one pipeline: draining N sockets
// costs one script per user and one round trip per drainUsersPerTrip
// users, instead of one script and a share of a small pipeline per
// connection. The instance index keeps the members: Deregister replaces
// them with the offline checks still pending when the instance stops, and
// should the instance die first, the survivors' sweep of what it still
// lists is a harmless repeat that runs the users' checks.
const drainUsersPerTrip = 512

// DisconnectMany removes conns, a duplicate or an already removed one
// harmlessly, marks them closed and schedules the offline check of every
// user left with no live connection, as Disconnect does. It leaves their
// entries in this instance's index (a stopping instance calls Deregister
// next). It returns the time Redis recorded, or the zero time when no
// removal answered (the caller then records no last-seen time, as after a
// Disconnect that got no answer). On
// an error, the connections of the failed round trip and of those after it
// are removed again later, as DisconnectLater does, and their users'
// offline checks follow that removal (or, should Redis not answer for
// ConnTTL, the connections going stale).
func (p *Presence) DisconnectMany(ctx context.Context, conns []Conn) (time.Time, error) {
	at, left, err := p.disconnectMany(ctx, conns)
	if err != nil {
		p.removalFailed(left)
	}
	return at, err
}

// disconnectMany is DisconnectMany without the later removal: left holds
// the connections whose removal got no answer.
func (p *Presence) disconnectMany(ctx context.Context, conns []Conn) (at time.Time, left []Conn, err error) {
	type user struct {
		id    string
		conns []string
	}
	var users []*user
	byID := map[string]*user{}
	for _, c := range conns {
		u := byID[c.UserID]
		if u == nil {
			u = &user{id: c.UserID}
			byID[c.UserID] = u
			users = append(users, u)
		}
		u.conns = append(u.conns, c.ConnID)
	}
	unanswered := func(us []*user) {
		for _, u := range us {
			for _, c := range u.conns {
				left = append(left, Conn{UserID: u.id, ConnID: c})
			}
		}
	}
	for len(users) > 0 {
		n := min(len(users), drainUsersPerTrip)
		batch := users[:n]
		users = users[n:]
		cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
			for _, u := range batch {
				p.disconnectUser(ctx, pipe, u.id, u.conns)
			}
		})
		for i, u := range batch {
			if i >= len(cmds) {
				unanswered(batch[i:])
				break
			}
			if v, err := lua.Reply(cmds[i]).Slice(); err == nil {
				if t := p.afterDisconnect(u.id, v, 0); !t.IsZero() {
					at = t
				}
			} else {
				unanswered(batch[i : i+1])
			}
		}
		if err != nil {
			unanswered(users)
			return at, left, fmt.Errorf("presence disconnect: %w", rds.ClassifyRedisError(err))
		}
	}
	return at, nil, nil
}

// disconnectUser queues the removal of a user's connections. Each one is
// marked closed (for ConnTTL), as Disconnect does: a periodic heartbeat
// already on its way when the drain began does not register it again.
func (p *Presence) disconnectUser(ctx context.Context, c redis.Scripter, userID string, connIDs []string) *redis.Cmd {
	keys := make([]string, 0, 1+2*len(connIDs))
	args := make([]any, 0, 1+len(connIDs))
	keys = append(keys, UserConnsKey(userID))
	args = append(args, ms(p.cfg.ConnTTL))
	for _, c := range connIDs {
		keys = append(keys, ConnKey(userID, c))
		args = append(args, c)
	}
	for _, c := range connIDs {
		keys = append(keys, ClosedKey(userID, c))
	}
	return lua.RTDisconnectUser.Run(ctx, c, keys, args...)
}
