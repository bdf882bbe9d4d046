package presence

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Conn is one live WebSocket connection of this instance.
type Conn struct {
	UserID        string
	ConnID        string
	Subscriptions int
}

// Events receives presence transitions. Each transition is reported once:
// Online when a user's first live connection registers, Offline when a
// user has had no live connection for the debounce period (after a local
// disconnect or a sweep). Calls run on goroutines tracked by Presence and
// must return promptly; one user's calls from one Presence run one at a
// time, in the order of the transitions. at is Redis's time of the
// transition: the registration that made the user online, or the user's
// last disconnect on the reporting instance — the offline check's own
// time when a connection registered after that disconnect (on any
// instance) and has gone since, or when Redis never recorded the
// disconnect. Transitions of one user seen by different instances are
// ordered by at, an offline after the online it ends (a user's keys live
// on one Redis node, so one clock stamps them all).
type Events interface {
	Online(ctx context.Context, userID string, at time.Time)
	Offline(ctx context.Context, userID string, at time.Time)
}

// Config tunes Presence. Every zero value picks the default shown.
type Config struct {
	InstanceID string // required

	// ConnTTL is the connection HASH's TTL; a ZSET member whose heartbeat
	// is older is stale. Zero value means 90s.
	ConnTTL time.Duration
	// UserTTL is the TTL of a user's connection ZSET and online marker.
	// Zero value means 120s.
	UserTTL time.Duration
	// RefreshInterval is how often every local connection's heartbeat runs.
	// Zero value means ConnTTL/3.
	RefreshInterval time.Duration
	// LivenessTTL is the instance marker's TTL: survivors sweep an instance
	// whose marker expired. Zero value means 10s.
	LivenessTTL time.Duration
	// LivenessInterval is how often the marker is refreshed. Zero value
	// means LivenessTTL/3.
	LivenessInterval time.Duration
	// RegistryTTL is the TTL of han:rt:instances and of each instance's
	// connection index. Zero value means 120s.
	RegistryTTL time.Duration
	// SweepInterval is how often survivors look for dead instances. Zero
	// value means 5s. A crashed instance's users go offline within
	// LivenessTTL + SweepInterval (+ OfflineDebounce for the event).
	SweepInterval time.Duration
	// OfflineDebounce delays the offline transition so a quick reconnect
	// publishes nothing. Zero value means 2s.
	OfflineDebounce time.Duration
	// MaxConnsPerUser caps a user's live connections across all instances
	// (HAN_WS_MAX_CONNS_PER_USER): Connect refuses one more with
	// ErrTooManyConnections. A connection's slot is free again when it
	// disconnects, is swept with its dead instance or goes stale; such a
	// connection, still open on an instance that was only paused, gets a
	// slot again only within the cap (see Refused). Zero value means 16.
	MaxConnsPerUser int
	// StaleBatch bounds the stale ZSET members one heartbeat removes. Zero
	// value means 100.
	StaleBatch int
	// SweepBatch bounds the connections removed per sweep round trip. Zero
	// value means 200.
	SweepBatch int
	// Linger is how long a connect or disconnect that finds a pipeline
	// free waits for others to share it (0: sent at once).
	Linger time.Duration
	// RetakeAfter is how long after DisconnectLater a registration is
	// removed again (then retried while Redis does not answer). Zero value
	// means 1s.
	RetakeAfter time.Duration
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
	// Refused, when set, is called by the periodic refresh with the open
	// connections it found no longer registered (survivors swept them
	// while this instance looked dead: a long pause) and could not
	// register again, because the user has reached MaxConnsPerUser on
	// other connections meanwhile. Their sockets should close as a connect
	// over the cap is refused; until they do, each refresh refuses them
	// again (or registers them, once a slot is free). Called on the
	// refresh's goroutine: it must not block.
	Refused func(conns []Conn)
	// Jitter draws the jitter of the background loops' sleeps (liveness,
	// heartbeats, sweeps): a duration in [0, spread], clamped to it. Nil
	// means uniformly at random. A test pins it to spread to run the loops
	// at their longest sleep, the gap MaxLivenessGap promises to cover.
	Jitter func(spread time.Duration) time.Duration
}

func (c *Config) defaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.ConnTTL, 90*time.Second)
	def(&c.UserTTL, 120*time.Second)
	def(&c.RefreshInterval, c.ConnTTL/3)
	def(&c.LivenessTTL, 10*time.Second)
	def(&c.LivenessInterval, c.LivenessTTL/3)
	def(&c.RegistryTTL, 120*time.Second)
	def(&c.SweepInterval, 5*time.Second)
	def(&c.OfflineDebounce, 2*time.Second)
	def(&c.RetakeAfter, time.Second)
	if c.MaxConnsPerUser <= 0 {
		c.MaxConnsPerUser = 16
	}
	if c.StaleBatch <= 0 {
		c.StaleBatch = 100
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 200
	}
}

// Key names (docs/redis-keys.md). The user id is the hash tag of every per-user
// key, so one script updates a connection's HASH, the user's ZSET and the
// online marker atomically on Cluster too; the instance id is the tag of
// the instance's marker and connection index.
const (
	// InstancesKey is the registry ZSET instance id → last liveness ms.
	InstancesKey = "han:rt:instances"
)

// ConnKey is the connection HASH han:rt:conn:{<user_id>}:<connection_id>.
func ConnKey(userID, connID string) string { return "han:rt:conn:{" + userID + "}:" + connID }

// ClosedKey is han:rt:conn:{<user_id>}:<connection_id>:closed, set by the
// disconnect of a connection whose socket closed: a periodic heartbeat sent
// before that does not register it again.
func ClosedKey(userID, connID string) string { return ConnKey(userID, connID) + ":closed" }

// UserConnsKey is the ZSET han:rt:user:{<user_id>}:connections.
func UserConnsKey(userID string) string { return "han:rt:user:{" + userID + "}:connections" }

// OnlineKey is han:rt:user:{<user_id>}:online, present while the user's
// online transition has been published and the offline one has not.
func OnlineKey(userID string) string { return "han:rt:user:{" + userID + "}:online" }

// OfflineKey is han:rt:user:{<user_id>}:offline, the token of the offline
// check that deleted the online marker: the same check run again (its
// reply was lost) reports the transition again.
func OfflineKey(userID string) string { return "han:rt:user:{" + userID + "}:offline" }

// InstanceKey is the liveness marker han:rt:instance:{<instance_id>}.
func InstanceKey(instanceID string) string { return "han:rt:instance:{" + instanceID + "}" }

// InstanceConnsKey is han:rt:instance:{<instance_id>}:connections, ZSET
// "<user_id>:<connection_id>" → heartbeat ms, what the sweeper removes.
func InstanceConnsKey(instanceID string) string {
	return "han:rt:instance:{" + instanceID + "}:connections"
}
