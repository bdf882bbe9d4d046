package project

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// ErrUnsafeEvictionPolicy means Redis runs under an eviction policy that may
// evict keys without a TTL (allkeys-*) or one this service does not know, so
// project API writes are refused (503 unsafe_eviction_policy).
var ErrUnsafeEvictionPolicy = errors.New("project: unsafe redis eviction policy")

// WritesAllowedUnder reports whether project writes are safe under a
// maxmemory-policy: noeviction and volatile-lru|lfu|random|ttl only evict
// keys that carry a TTL (cache entries), never reliable or metadata keys.
// Memory usage itself is not a gate: a full instance still takes writes by
// evicting cache entries that carry a TTL.
func WritesAllowedUnder(policy string) bool {
	switch policy {
	case "noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl":
		return true
	}
	return false
}

// EvictionGate reads maxmemory_policy from INFO memory (allowed to
// api_backend by +info) and caches it for a few seconds, so the check costs
// one INFO per instance per TTL rather than one per request. Safe for
// concurrent use.
type EvictionGate struct {
	rdb redis.UniversalClient
	ttl time.Duration

	mu      sync.Mutex // guards policy and fetched
	policy  string
	fetched time.Time
}

// NewEvictionGate returns a gate over rdb. A zero ttl means 3s.
func NewEvictionGate(rdb redis.UniversalClient, ttl time.Duration) *EvictionGate {
	if ttl <= 0 {
		ttl = 3 * time.Second
	}
	return &EvictionGate{rdb: rdb, ttl: ttl}
}

// Policy returns the current maxmemory-policy (cached).
func (g *EvictionGate) Policy(ctx context.Context) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.policy != "" && time.Since(g.fetched) < g.ttl {
		return g.policy, nil
	}
	info, err := g.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return "", rds.ClassifyRedisError(err)
	}
	p := parseMaxmemoryPolicy(info)
	if p == "" {
		// INFO without the field: an unknown policy, which is unsafe.
		p = "unknown"
	}
	g.policy, g.fetched = p, time.Now()
	return p, nil
}

// CheckWrite returns nil when writes are allowed, ErrUnsafeEvictionPolicy
// when the policy forbids them, or a classified Redis error.
func (g *EvictionGate) CheckWrite(ctx context.Context) error {
	p, err := g.Policy(ctx)
	if err != nil {
		return err
	}
	if !WritesAllowedUnder(p) {
		return ErrUnsafeEvictionPolicy
	}
	return nil
}

func parseMaxmemoryPolicy(info string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "maxmemory_policy:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
