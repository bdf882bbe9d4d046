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
// requires, but many users' scripts share one pipeline, and the instance
// index loses the whole pipeline's members in one command: draining N
// sockets costs about one script per user and one round trip per
// drainUsersPerTrip users, instead of one script and a share of a small
// pipeline per connection.
const drainUsersPerTrip = 512

// DisconnectMany removes conns, a duplicate or an already removed one
// harmlessly, and schedules the offline check of every user left with no
// live connection, as Disconnect does. It returns the time Redis recorded
// (now if nothing answered). On an error, the connections of the failed
// round trip and of those after it stay until their TTL.
func (p *Presence) DisconnectMany(ctx context.Context, conns []Conn) (time.Time, error) {
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
	at := time.Now()
	for len(users) > 0 {
		n := min(len(users), drainUsersPerTrip)
		batch := users[:n]
		users = users[n:]
		var members []any
		for _, u := range batch {
			for _, c := range u.conns {
				members = append(members, u.id+":"+c)
			}
		}
		cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
			for _, u := range batch {
				p.disconnectUser(ctx, pipe, u.id, u.conns)
			}
			pipe.ZRem(ctx, InstanceConnsKey(p.cfg.InstanceID), members...)
		})
		for i, u := range batch {
			if i >= len(cmds) {
				break
			}
			if v, err := cmds[i].(*redis.Cmd).Slice(); err == nil {
				at = p.afterDisconnect(u.id, v)
			}
		}
		if err != nil {
			return at, fmt.Errorf("presence disconnect: %w", rds.ClassifyRedisError(err))
		}
	}
	return at, nil
}

// disconnectUser queues the removal of a user's connections.
func (p *Presence) disconnectUser(ctx context.Context, c redis.Scripter, userID string, connIDs []string) *redis.Cmd {
	keys := make([]string, 0, 1+len(connIDs))
	args := make([]any, 0, 1+len(connIDs))
	keys = append(keys, UserConnsKey(userID))
	args = append(args, ms(p.cfg.ConnTTL))
	for _, c := range connIDs {
		keys = append(keys, ConnKey(userID, c))
		args = append(args, c)
	}
	return lua.RTDisconnectUser.Run(ctx, c, keys, args...)
}
