package rds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// Lock kinds (han:coord:lock:<kind>:{<id>}, docs/redis-keys.md).
const (
	LockDelivery        = "delivery"
	LockSafetyRecovery  = "safety-recovery"
	LockSettingsRefresh = "settings-refresh"
	// LockPresenceSweep serialises the survivors sweeping one dead
	// instance's connections (docs/realtime-protocol.md).
	LockPresenceSweep = "presence-sweep"
)

// Lock errors. Extend and Release tell a lock that another owner holds now
// (lost: somebody acquired it after ours expired) from one that is simply
// gone (expired, nobody holds it).
var (
	ErrLockHeld    = errors.New("store: lock held by another owner")
	ErrLockLost    = errors.New("store: lock lost to another owner")
	ErrLockExpired = errors.New("store: lock expired")
)

// DefaultLockTTL is the lock lifetime (30 s).
const DefaultLockTTL = 30 * time.Second

// fenceTTL keeps a fencing counter for a day after its last acquisition.
const fenceTTL = 24 * time.Hour

// Locker takes coordination locks in Redis DB1 (han:coord:*). Redis locks
// are an optimisation: callers also hold PostgreSQL row locks or leases,
// and unique constraints stay the final guard. Safe for
// concurrent use.
//
// A Redis that stalls instead of failing runs the calls it already received
// when it wakes. An acquire whose caller gave up waiting would then hold
// the lock for an owner token nobody knows, for the lock's whole TTL, and
// the work it guards would start that much later everywhere; a release
// that never arrived leaves the lock to its TTL likewise. So the Locker
// remembers the tokens of acquires and releases that got no reply, and its
// next Acquire (of any lock, on a Redis Cluster of any lock on the same
// master; the work a failed acquire guarded was not done, so its caller
// tries again on its next tick) first releases them: compare-and-delete,
// so only a lock that token holds goes. A token is
// forgotten once its release answered, or once its lock's TTL would have
// ended anyway.
type Locker struct {
	rdb redis.Scripter
	// unknown holds the tokens of acquires and releases that got no reply.
	unknown *LateCalls[lockToken]
}

// lockToken is a lock key and an owner token that may hold it.
type lockToken struct{ key, owner string }

const (
	// maxUnanswered bounds the remembered tokens; past it a lock taken by
	// a late call is left to its TTL, as without them.
	maxUnanswered = 64
	// staleEvery spaces the releases of remembered tokens (acquires may
	// come many times a second: the outbox relay takes one lock per row).
	staleEvery = 250 * time.Millisecond
	// staleSettle is how long a token whose release found no lock is kept
	// and released again: the late call may not have run yet. A woken
	// Redis runs what it had received within its first event-loop turns.
	staleSettle = 2 * time.Second
)

// NewLocker returns a Locker on the DB1 client.
func NewLocker(rdb redis.Scripter) *Locker {
	return &Locker{rdb: rdb, unknown: &LateCalls[lockToken]{Max: maxUnanswered, Every: staleEvery, Settle: staleSettle}}
}

// Lock is one acquisition. Fence is the fencing token: strictly greater
// than every earlier acquisition's of the same lock (while the counter
// lives, 24 h), so a downstream store can refuse a late writer.
type Lock struct {
	Key   string
	Owner string
	Fence int64

	l   *Locker
	ttl time.Duration // of the last acquire or extend
}

// LockKey is han:coord:lock:<kind>:{<id>}.
func LockKey(kind, id string) string { return "han:coord:lock:" + kind + ":{" + id + "}" }

// FenceKey is han:coord:fence:<kind>:{<id>}, in the lock's hash slot.
func FenceKey(kind, id string) string { return "han:coord:fence:" + kind + ":{" + id + "}" }

func validLockPart(s string) bool {
	return s != "" && len(s) <= 128 && !strings.ContainsAny(s, "{}: \t\r\n")
}

// Acquire takes the lock kind/id for ttl (zero means DefaultLockTTL) with
// SET NX PX and a fresh random owner token. When another owner holds it,
// the error is ErrLockHeld and retryAfter is the holder's remaining TTL.
func (l *Locker) Acquire(ctx context.Context, kind, id string, ttl time.Duration) (lk *Lock, retryAfter time.Duration, err error) {
	if !validLockPart(kind) || !validLockPart(id) {
		return nil, 0, fmt.Errorf("store: invalid lock name")
	}
	if ttl <= 0 {
		ttl = DefaultLockTTL
	}
	key := LockKey(kind, id)
	l.releaseUnanswered(ctx, key)
	owner := newOwnerToken()
	v, err := lua.LockAcquire.Run(ctx, l.rdb, []string{key, FenceKey(kind, id)},
		owner, ttl.Milliseconds(), fenceTTL.Milliseconds()).Slice()
	if err != nil {
		if Unanswered(err) {
			l.remember(key, owner, ttl)
		}
		return nil, 0, fmt.Errorf("acquire lock: %w", ClassifyRedisError(err))
	}
	if len(v) < 2 {
		return nil, 0, fmt.Errorf("acquire lock: %w", ErrRedisUnavailable)
	}
	ok, _ := v[0].(int64)
	n, _ := v[1].(int64)
	if ok != 1 {
		return nil, time.Duration(max(n, 0)) * time.Millisecond, ErrLockHeld
	}
	return &Lock{Key: key, Owner: owner, Fence: n, l: l, ttl: ttl}, 0, nil
}

// Extend resets the lock's TTL if this acquisition still owns it:
// ErrLockLost when another owner holds it, ErrLockExpired when nobody does.
func (lk *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = DefaultLockTTL
	}
	n, err := lua.LockExtend.Run(ctx, lk.l.rdb, []string{lk.Key}, lk.Owner, ttl.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("extend lock: %w", ClassifyRedisError(err))
	}
	lk.ttl = max(lk.ttl, ttl)
	return lockResult(n)
}

// Release deletes the lock if this acquisition still owns it (compare and
// delete): ErrLockLost or ErrLockExpired otherwise, and nothing is deleted.
func (lk *Lock) Release(ctx context.Context) error {
	n, err := lua.LockRelease.Run(ctx, lk.l.rdb, []string{lk.Key}, lk.Owner).Int()
	if err != nil {
		if Unanswered(err) {
			lk.l.remember(lk.Key, lk.Owner, lk.ttl)
		}
		return fmt.Errorf("release lock: %w", ClassifyRedisError(err))
	}
	return lockResult(n)
}

// remember keeps the owner token of a lock call that got no reply, for
// releaseUnanswered.
func (l *Locker) remember(key, owner string, ttl time.Duration) {
	if ttl <= 0 {
		ttl = DefaultLockTTL
	}
	l.unknown.Add(lockToken{key, owner}, ttl)
}

// releaseUnanswered releases the locks the remembered tokens may hold, at
// most once per staleEvery, within ctx. A token goes once its release
// answered that the lock was released or held by another owner, once its
// lock would have expired, or staleSettle after a release first found no
// lock; a release that got no reply keeps it. On a Redis Cluster only the
// tokens on key's master are released (the master the acquire of key
// waits for anyway): a token on a master that stalls would otherwise hold
// every acquire on the healthy ones for a read timeout. The others wait
// for an acquire on their master, or lapse with their lock.
func (l *Locker) releaseUnanswered(ctx context.Context, key string) {
	now := time.Now()
	todo := l.unknown.Take(now)
	if len(todo) == 0 {
		return
	}
	node := MasterAddr(ctx, l.rdb, key)
	var elsewhere []LateCall[lockToken]
	for i, e := range todo {
		if MasterAddr(ctx, l.rdb, e.V.key) != node {
			elsewhere = append(elsewhere, e)
			continue
		}
		n, err := lua.LockRelease.Run(ctx, l.rdb, []string{e.V.key}, e.V.owner).Int()
		switch {
		case Unanswered(err):
			// Redis still does not answer: keep the rest untried.
			l.unknown.Keep(append(elsewhere, todo[i:]...)...)
			return
		case err != nil:
			l.unknown.Keep(e)
		case n < 0:
			l.unknown.Settling(now, e)
		}
	}
	l.unknown.Keep(elsewhere...)
}

func lockResult(n int) error {
	switch n {
	case 1:
		return nil
	case 0:
		return ErrLockLost
	default:
		return ErrLockExpired
	}
}

func newOwnerToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
