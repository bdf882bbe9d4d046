package clustertest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// place is one set of identities (user, connection, instance, project,
// topic, subscription, environment, idempotency key, lock, task); each
// place n puts every hash tag elsewhere in the slot space. Keys come from the
// service's own key builders, so the scripts run on the keys production
// passes them.
type place struct{ n int }

func (p place) id(kind byte) string {
	return fmt.Sprintf("00000000-0000-7000-8%03x-%012x", kind, p.n)
}
func (p place) user() string     { return p.id(1) }
func (p place) instance() string { return fmt.Sprintf("inst-%d", p.n) }
func (p place) env() string      { return fmt.Sprintf("dev%d", p.n) }
func (p place) project() project.Keys {
	return project.NewKeys(p.env(), p.id(2))
}
func (p place) module() project.ModuleKeys { return project.NewModuleKeys(p.env()) }
func (p place) topic() string              { return p.id(3) }
func (p place) sub() string                { return p.id(4) }
func (p place) idem() store.IdemKey {
	return store.IdemKey{Scope: "msg_send", UserID: p.user(), KeyHMAC: fmt.Sprintf("%064x", p.n)}
}

// tagged are representative keys of every hash-tagged key family at p: the
// test checks that the places spread each family over every master.
func (p place) tagged() map[string]string {
	return map[string]string{
		"presence": presence.ConnKey(p.user(), "c1"),
		"instance": presence.InstanceKey(p.instance()),
		"project":  p.project().Meta(),
		"module":   p.module().Budget(),
		"idem":     p.idem().RecordKey(),
		"lock":     rds.LockKey("outbox", p.id(5)),
	}
}

type invocation func(ctx context.Context, c redis.Scripter, p place) error

// invocations runs every embedded script with representative arguments on
// the keys of place p. A script without an entry fails the test, so a new
// script cannot skip the cluster check.
var invocations = map[string]invocation{
	"lock_acquire": func(ctx context.Context, c redis.Scripter, p place) error {
		id := p.id(5)
		return lua.LockAcquire.Run(ctx, c, []string{rds.LockKey("outbox", id), rds.FenceKey("outbox", id)}, "owner", 30000, 86400000).Err()
	},
	"lock_extend": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.LockExtend.Run(ctx, c, []string{rds.LockKey("outbox", p.id(5))}, "owner", 30000).Err()
	},
	"lock_release": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.LockRelease.Run(ctx, c, []string{rds.LockKey("outbox", p.id(5))}, "owner").Err()
	},
	"idem_reserve": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemReserve.Run(ctx, c, idemKeys(p), "fp", "owner", 30000).Err()
	},
	"idem_extend": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemExtend.Run(ctx, c, idemKeys(p), "owner", 30000).Err()
	},
	"idem_complete": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemComplete.Run(ctx, c, idemKeys(p), "owner", "fp", 201, "rid", 1, "", 86400000).Err()
	},
	"idem_takeover": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemTakeover.Run(ctx, c, idemKeys(p), "fp", "dead", "owner", 30000).Err()
	},
	"idem_release": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemRelease.Run(ctx, c, idemKeys(p), "owner").Err()
	},
	"idem_abandon": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.IdemAbandon.Run(ctx, c, idemKeys(p), "owner", 30000).Err()
	},
	"rt_heartbeat": func(ctx context.Context, c redis.Scripter, p place) error {
		u := p.user()
		return lua.RTHeartbeat.Run(ctx, c, []string{presence.ConnKey(u, "c1"), presence.UserConnsKey(u), presence.OnlineKey(u)},
			u, "c1", p.instance(), 0, 90000, 120000, 100).Err()
	},
	"rt_disconnect": func(ctx context.Context, c redis.Scripter, p place) error {
		u := p.user()
		return lua.RTDisconnect.Run(ctx, c, []string{presence.ConnKey(u, "c1"), presence.UserConnsKey(u)}, "c1", 90000, 100).Err()
	},
	"rt_disconnect_user": func(ctx context.Context, c redis.Scripter, p place) error {
		u := p.user()
		return lua.RTDisconnectUser.Run(ctx, c, []string{presence.UserConnsKey(u), presence.ConnKey(u, "c1"), presence.ConnKey(u, "c2")},
			90000, "c1", "c2").Err()
	},
	"rt_offline": func(ctx context.Context, c redis.Scripter, p place) error {
		u := p.user()
		return lua.RTOffline.Run(ctx, c, []string{presence.UserConnsKey(u), presence.OnlineKey(u)}, 90000).Err()
	},
	"rt_presence": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.RTPresence.Run(ctx, c, []string{presence.UserConnsKey(p.user())}, 90000).Err()
	},
	"rt_instance_heartbeat": func(ctx context.Context, c redis.Scripter, p place) error {
		i := p.instance()
		return lua.RTInstanceHeartbeat.Run(ctx, c, []string{presence.InstanceKey(i), presence.InstanceConnsKey(i)},
			10000, 120000, p.user()+":c1").Err()
	},
	"rt_instances_add": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.RTInstancesAdd.Run(ctx, c, []string{presence.InstancesKey}, p.instance(), 120000).Err()
	},
	"rt_index_remove": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.RTIndexRemove.Run(ctx, c, []string{presence.InstanceConnsKey(p.instance())}, p.user()+":c1", "1").Err()
	},
	"rt_index_update": func(ctx context.Context, c redis.Scripter, p place) error {
		return lua.RTIndexUpdate.Run(ctx, c, []string{presence.InstanceConnsKey(p.instance())}, 120000, 1, p.user()+":c1", p.user()+":~offline").Err()
	},
	"rt_ticket_redeem": func(ctx context.Context, c redis.Scripter, p place) error {
		return nilOK(lua.RTTicketRedeem.Run(ctx, c, []string{"han:rt:ticket:v2:" + p.id(6)}).Err())
	},
	"stub_task_create": func(ctx context.Context, c redis.Scripter, p place) error {
		return asAdmin(ctx, func(a redis.Scripter) error {
			return lua.StubTaskCreate.Run(ctx, a, []string{store.StubTaskKey(p.id(7))}, 180000).Err()
		})
	},
	"stub_task_poll": func(ctx context.Context, c redis.Scripter, p place) error {
		return asAdmin(ctx, func(a redis.Scripter) error {
			return nilOK(lua.StubTaskPoll.Run(ctx, a, []string{store.StubTaskKey(p.id(7))}, 3, "approved").Err())
		})
	},
}

func idemKeys(p place) []string {
	return []string{p.idem().RecordKey(), p.idem().LockKey(), p.idem().GoneKey()}
}

func nilOK(err error) error {
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// asAdmin runs a legacy stub script as the admin user: the stub's own user
// exists only on the legacy standalone server (its DB2), never on a
// cluster, but its scripts must be single-slot like every other.
func asAdmin(ctx context.Context, run func(c redis.Scripter) error) error {
	a := env.Cluster.AdminClient()
	defer a.Close()
	return run(a)
}

// The rate-limit scripts on a cluster take one key per call: the limiter
// evaluates the families of a request one at a time there
// (ratelimit.ModePerFamily), since the families' keys have no common tag.
func init() {
	rl := func(s *lua.Script, a ratelimit.Algorithm) invocation {
		return func(ctx context.Context, c redis.Scripter, p place) error {
			key := ratelimit.Key(ratelimit.FamilyUser, p.user(), ratelimit.RouteHash("send"), a, 1e9)
			return s.Run(ctx, c, []string{key}, "req-1", 10, 1000, 10).Err()
		}
	}
	invocations["ratelimit_sliding"] = rl(lua.RateLimitSliding, ratelimit.SlidingLog)
	invocations["ratelimit_fixed"] = rl(lua.RateLimitFixed, ratelimit.FixedWindow)
	invocations["ratelimit_bucket"] = rl(lua.RateLimitBucket, ratelimit.TokenBucket)
	invocations["ratelimit_refund"] = func(ctx context.Context, c redis.Scripter, p place) error {
		for _, a := range []ratelimit.Algorithm{ratelimit.SlidingLog, ratelimit.FixedWindow, ratelimit.TokenBucket} {
			key := ratelimit.Key(ratelimit.FamilyUser, p.user(), ratelimit.RouteHash("send"), a, 1e9)
			if err := lua.RateLimitRefund.Run(ctx, c, []string{key}, string(a), "req-1", 1000, 10, 0, 10).Err(); err != nil {
				return err
			}
		}
		return nil
	}
}
