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
type Locker struct {
	rdb redis.Scripter
}

// NewLocker returns a Locker on the DB1 client.
func NewLocker(rdb redis.Scripter) *Locker { return &Locker{rdb: rdb} }

// Lock is one acquisition. Fence is the fencing token: strictly greater
// than every earlier acquisition's of the same lock (while the counter
// lives, 24 h), so a downstream store can refuse a late writer.
type Lock struct {
	Key   string
	Owner string
	Fence int64

	l *Locker
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
	owner := newOwnerToken()
	key := LockKey(kind, id)
	v, err := lua.LockAcquire.Run(ctx, l.rdb, []string{key, FenceKey(kind, id)},
		owner, ttl.Milliseconds(), fenceTTL.Milliseconds()).Slice()
	if err != nil {
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
	return &Lock{Key: key, Owner: owner, Fence: n, l: l}, 0, nil
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
	return lockResult(n)
}

// Release deletes the lock if this acquisition still owns it (compare and
// delete): ErrLockLost or ErrLockExpired otherwise, and nothing is deleted.
func (lk *Lock) Release(ctx context.Context) error {
	n, err := lua.LockRelease.Run(ctx, lk.l.rdb, []string{lk.Key}, lk.Owner).Int()
	if err != nil {
		return fmt.Errorf("release lock: %w", ClassifyRedisError(err))
	}
	return lockResult(n)
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
