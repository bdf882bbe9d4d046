package rds

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// masterDowns are the masters of a Redis Cluster a RedisHealth found
// unreachable, by address.
type masterDowns struct {
	n  atomic.Int32 // len(m), read without mu
	mu sync.Mutex   // guards m
	m  map[string]masterDown
}

// masterDown is one master found unreachable: its node client, which the
// prober PINGs, and a key of its slots, which tells when a failover moved
// them elsewhere.
type masterDown struct {
	node *redis.Client
	key  string
}

// PerMaster reports whether h tracks each master apart (a Redis Cluster
// client): a failure of a call is then its master's, and MarkDown, which
// fails every call, is for a failure that is not one master's.
func (h *RedisHealth) PerMaster() bool { return h != nil && h.cluster != nil }

// CheckKey is Check for a call on key: on a cluster it fails at once too
// while key's master is down, and only then.
func (h *RedisHealth) CheckKey(key string) error {
	if err := h.Check(); err != nil || h == nil || h.masters.n.Load() == 0 {
		return err
	}
	addr := MasterAddr(context.Background(), h.cluster, key)
	h.masters.mu.Lock()
	_, down := h.masters.m[addr]
	h.masters.mu.Unlock()
	if down {
		return ErrRedisUnavailable
	}
	return nil
}

// ObserveKey is Observe for a call on key: on a cluster a call that did not
// reach its master marks that master down, not the others.
func (h *RedisHealth) ObserveKey(key string, err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if h != nil && unreachable(err) {
		h.markMasterDown(key)
	}
	return ClassifyRedisError(err)
}

// PingKey is Ping for the calls on key: it fails at once while key's
// master is down (CheckKey), else PINGs that master, and a PING that does
// not reach it marks that master down (ObserveKey), not the others. On a
// standalone client it is Ping. The caller bounds ctx.
func (h *RedisHealth) PingKey(ctx context.Context, key string) error {
	if err := h.CheckKey(key); err != nil {
		return err
	}
	if !h.PerMaster() {
		return h.Observe(h.c.Ping(ctx).Err())
	}
	node, err := h.cluster.MasterForKey(ctx, key)
	if err != nil {
		return h.ObserveKey(key, err)
	}
	return h.ObserveKey(key, node.Ping(ctx).Err())
}

// markMasterDown marks key's master down (all of Redis on a standalone
// client or without a slot map) and starts the prober.
func (h *RedisHealth) markMasterDown(key string) {
	var node *redis.Client
	if h.cluster != nil {
		node, _ = h.cluster.MasterForKey(context.Background(), key)
	}
	if node == nil {
		h.MarkDown()
		return
	}
	addr := node.Options().Addr
	h.masters.mu.Lock()
	_, was := h.masters.m[addr]
	if !was {
		if h.masters.m == nil {
			h.masters.m = map[string]masterDown{}
		}
		h.masters.m[addr] = masterDown{node: node, key: key}
		h.masters.n.Store(int32(len(h.masters.m)))
	}
	h.masters.mu.Unlock()
	if was {
		return
	}
	h.logger.Warn("redis master unreachable: failing fast the calls on its keys until it answers again",
		slog.String("master", addr))
	h.report()
	h.prober.Start()
}

// probeMasters PINGs each master found unreachable, at once, and marks up
// those that answered and those whose slots a failover gave another
// master meanwhile.
func (h *RedisHealth) probeMasters(ctx context.Context) {
	h.masters.mu.Lock()
	downs := make(map[string]masterDown, len(h.masters.m))
	for addr, d := range h.masters.m {
		downs[addr] = d
	}
	h.masters.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var up []string
	for addr, d := range downs {
		wg.Go(func() {
			if d.node.Ping(ctx).Err() == nil || MasterAddr(ctx, h.cluster, d.key) != addr {
				mu.Lock()
				up = append(up, addr)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(up) == 0 {
		return
	}
	h.masters.mu.Lock()
	for _, addr := range up {
		delete(h.masters.m, addr)
	}
	h.masters.n.Store(int32(len(h.masters.m)))
	h.masters.mu.Unlock()
	for _, addr := range up {
		h.logger.Info("redis master reachable again", slog.String("master", addr))
	}
}
