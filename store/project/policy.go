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
//
// No caller ever waits on another's Redis call: once the cached policy is
// stale, concurrent callers share one refresh that runs detached from them,
// and each waits for it only as long as its own context allows. A refresh
// that fails is remembered for policyFailureTTL, so the callers that arrive
// just after it get its error at once: a stalled Redis costs the gate one
// timeout, not one per queued write.
type EvictionGate struct {
	rdb redis.UniversalClient
	ttl time.Duration

	mu       sync.Mutex // guards the fields below; never held across a Redis call
	policy   string
	fetched  time.Time
	failure  error        // the last refresh's error, nil after a success
	failedAt time.Time    // when failure was learned
	flight   *policyFetch // the refresh in progress, nil when none
}

// policyFetch is one INFO memory that concurrent callers share; policy and
// err are set before done is closed.
type policyFetch struct {
	done   chan struct{}
	policy string
	err    error
}

const (
	// policyFailureTTL is how long a failed refresh answers the callers that
	// arrive after it, before the next one tries Redis again.
	policyFailureTTL = 500 * time.Millisecond
	// policyFetchTimeout bounds a shared refresh, which runs detached from
	// its callers; the client's own read timeout normally ends it sooner.
	policyFetchTimeout = 5 * time.Second
)

// NewEvictionGate returns a gate over rdb. A zero ttl means 3s.
func NewEvictionGate(rdb redis.UniversalClient, ttl time.Duration) *EvictionGate {
	if ttl <= 0 {
		ttl = 3 * time.Second
	}
	return &EvictionGate{rdb: rdb, ttl: ttl}
}

// Policy returns the current maxmemory-policy (cached). When the cache is
// stale it waits for the shared refresh, or until ctx ends.
func (g *EvictionGate) Policy(ctx context.Context) (string, error) {
	g.mu.Lock()
	now := time.Now()
	if g.policy != "" && now.Sub(g.fetched) < g.ttl {
		p := g.policy
		g.mu.Unlock()
		return p, nil
	}
	if g.failure != nil && now.Sub(g.failedAt) < policyFailureTTL {
		err := g.failure
		g.mu.Unlock()
		return "", err
	}
	f := g.flight
	if f == nil {
		f = &policyFetch{done: make(chan struct{})}
		g.flight = f
		// Detached from the caller: the callers sharing the refresh must
		// not fail because the first one went away. The values of ctx go
		// along.
		go g.refresh(context.WithoutCancel(ctx), f)
	}
	g.mu.Unlock()
	select {
	case <-f.done:
		return f.policy, f.err
	case <-ctx.Done():
		return "", rds.ClassifyRedisError(ctx.Err())
	}
}

// refresh runs one INFO memory for every caller waiting on f, records its
// outcome in the gate and then closes f.done.
func (g *EvictionGate) refresh(ctx context.Context, f *policyFetch) {
	ctx, cancel := context.WithTimeout(ctx, policyFetchTimeout)
	defer cancel()
	info, err := g.rdb.Info(ctx, "memory").Result()
	if err != nil {
		f.err = rds.ClassifyRedisError(err)
	} else if f.policy = parseMaxmemoryPolicy(info); f.policy == "" {
		// INFO without the field: an unknown policy, which is unsafe.
		f.policy = "unknown"
	}
	g.mu.Lock()
	if f.err != nil {
		g.failure, g.failedAt = f.err, time.Now()
	} else {
		g.policy, g.fetched, g.failure = f.policy, time.Now(), nil
	}
	g.flight = nil
	g.mu.Unlock()
	close(f.done)
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
