package ratelimit

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/store/rds"
)

// breaker skips a Redis that did not answer for the cooldown, then lets one
// request at a time probe it.
type breaker struct {
	downUntil atomic.Int64 // unix ns until which Redis is skipped; 0: up
	probing   atomic.Bool  // one request probes Redis after the cooldown
}

// usable reports whether to ask: always while up; after an outage only
// once the cooldown passed, and then for one prober at a time (prober is
// set for it, which must clear probing when done).
func (b *breaker) usable(prober *bool) bool {
	until := b.downUntil.Load()
	if until == 0 {
		return true
	}
	if time.Now().UnixNano() < until {
		return false
	}
	if b.probing.CompareAndSwap(false, true) {
		*prober = true
		return true
	}
	return false
}

// record notes the outcome of a call: an answer closes the breaker, an
// unreachable Redis (refused, timed out, closed) opens it for cooldown;
// answers such as OOM or a script error are not outages.
func (b *breaker) record(err error, cooldown time.Duration) {
	switch {
	case err == nil:
		b.downUntil.Store(0)
	case err == rds.ErrRedisUnavailable:
		b.downUntil.Store(time.Now().Add(cooldown).UnixNano())
	}
}

// decideFamilies is Decide in per-family mode: one call per family, each on
// its key's master. On a Redis Cluster each master has its own breaker, so
// a master that stalls or dies fails fast only the decisions that need it:
// a decision is made while the breakers of all its families' masters let
// it, a family that got no answer opens its master's, and one that was
// answered closes its master's.
func (l *Limiter) decideFamilies(ctx context.Context, label string, p Policy, keys []string, rules []Rule) (Decision, error) {
	var bs, probed []*breaker
	if l.health == nil {
		bs = make([]*breaker, len(keys))
		for i, k := range keys {
			bs[i] = l.breakerOf(k)
			if slices.Contains(bs[:i], bs[i]) {
				continue // the same master as an earlier family
			}
			prober := false
			if !bs[i].usable(&prober) {
				release(probed)
				return l.finish(label, p, keys, rules, Decision{}, rds.ErrRedisUnavailable)
			}
			if prober {
				probed = append(probed, bs[i])
			}
		}
	} else {
		for _, k := range keys {
			if l.health.CheckKey(k) != nil {
				return l.finish(label, p, keys, rules, Decision{}, rds.ErrRedisUnavailable)
			}
		}
	}
	defer release(probed)
	l.refundUnanswered(keys)
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	d, answered, err := l.evalRedis(ctx, p, keys, rules)
	cancel()
	if l.clientLeft(false, err) {
		return Decision{}, err
	}
	switch {
	case l.health != nil:
		if err != nil && answered < len(keys) {
			l.health.ObserveKey(keys[answered], err)
		}
	default:
		for i := range answered {
			bs[i].record(nil, l.cooldown)
		}
		if err != nil && answered < len(bs) {
			bs[answered].record(err, l.cooldown)
		}
	}
	return l.finish(label, p, keys, rules, d, err)
}

// breakerOf is the breaker of key's master on a Redis Cluster, else
// Redis's.
func (l *Limiter) breakerOf(key string) *breaker {
	addr := rds.MasterAddr(context.Background(), l.rdb, key)
	if addr == "" {
		return &l.whole
	}
	if b, ok := l.masters.Load(addr); ok {
		return b.(*breaker)
	}
	b, _ := l.masters.LoadOrStore(addr, &breaker{})
	return b.(*breaker)
}

// release ends the probes of bs.
func release(bs []*breaker) {
	for _, b := range bs {
		b.probing.Store(false)
	}
}
