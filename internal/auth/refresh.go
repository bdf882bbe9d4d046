package auth

import (
	"context"
	"log/slog"
	"time"
)

// resolveMiss runs after a token named a kid the key set does not hold. It
// returns once whatever this miss may learn is in the key set (or nothing can
// be learned now); the caller then looks the kid up again.
//
// Concurrent misses for one kid share one resolution: the first registers it
// in inflight and runs it, the others wait for its done channel.
func (v *Verifier) resolveMiss(ctx context.Context, kid string) {
	if len(kid) > maxKIDBytes {
		return
	}
	now := v.cfg.Now()
	v.mu.Lock()
	if m := v.inflight[kid]; m != nil {
		v.mu.Unlock()
		select {
		case <-m.done:
		case <-ctx.Done():
		}
		return
	}
	if until, ok := v.noFetchUntil[kid]; ok && now.Before(until) {
		v.mu.Unlock()
		return
	}
	if !v.reserveLocked(kid, now) {
		warn := now.Sub(v.lastFullWarn) >= v.cfg.RefetchInterval
		if warn {
			v.lastFullWarn = now
		}
		v.mu.Unlock()
		if warn {
			v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: too many unknown kids; refetches paused",
				slog.Int("tracked", maxTrackedKIDs))
		}
		return
	}
	m := &kidMiss{done: make(chan struct{})}
	v.inflight[kid] = m
	seen := v.startGen
	v.mu.Unlock()

	defer func() {
		v.mu.Lock()
		delete(v.inflight, kid)
		v.mu.Unlock()
		close(m.done)
	}()
	// Detached from the caller: waiters share this resolution, so the first
	// caller going away must not fail theirs.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), missTimeout)
	defer cancel()

	kh := kidHash(kid)
	ttl, marked, redisOK := v.negativeMarker(mctx, kh)
	if marked {
		v.mu.Lock()
		v.noFetchUntil[kid] = now.Add(ttl)
		v.mu.Unlock()
		v.logger.LogAttrs(ctx, levelDebug, "auth: kid in negative cache", slog.String("kid_hash", kh))
		return
	}
	if err := v.refresh(mctx, seen); err != nil {
		v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: jwks refetch failed; keeping the previous keys",
			slog.String("kid_hash", kh), slog.Any("err", err))
		return
	}
	if v.keys.Load().has(kid) {
		v.logger.LogAttrs(ctx, slog.LevelInfo, "auth: jwks refetch found a new kid", slog.String("kid_hash", kh))
		return
	}
	if redisOK {
		// After a failed read the write would only add another timeout.
		v.setNegativeMarker(mctx, kh)
	}
	v.logger.LogAttrs(ctx, levelDebug, "auth: kid unknown after refetch", slog.String("kid_hash", kh))
}

// reserveLocked records that kid gets no further refetch for one interval.
// It refuses when the map is full of fresh entries, so a flood of random kids
// cannot grow memory or turn into a flood of fetches. v.mu must be held.
func (v *Verifier) reserveLocked(kid string, now time.Time) bool {
	if _, ok := v.noFetchUntil[kid]; !ok && len(v.noFetchUntil) >= maxTrackedKIDs {
		for k, until := range v.noFetchUntil {
			if !now.Before(until) && v.inflight[k] == nil {
				delete(v.noFetchUntil, k)
			}
		}
		if len(v.noFetchUntil) >= maxTrackedKIDs {
			return false
		}
	}
	v.noFetchUntil[kid] = now.Add(v.cfg.RefetchInterval)
	return true
}

// refresh reloads the JWKS. Fetches are serialised; a caller that queued
// behind a fetch which started after its miss (seen is the start counter read
// at the miss) takes that fetch's result instead of fetching again.
func (v *Verifier) refresh(ctx context.Context, seen uint64) error {
	select {
	case v.fetchSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-v.fetchSem }()

	v.mu.Lock()
	if v.doneGen > seen {
		v.mu.Unlock()
		return nil
	}
	v.startGen++
	gen := v.startGen
	v.mu.Unlock()

	ks, err := v.loadJWKS(ctx)
	if err != nil {
		return err
	}
	if ks.n == 0 && v.keys.Load().n > 0 {
		// An empty set from the issuer is far likelier a glitch than a
		// deliberate revocation of every key; dropping all keys would
		// reject every user at once.
		v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: refetched jwks holds no usable key; keeping the previous keys")
	} else {
		v.keys.Store(ks)
	}
	v.mu.Lock()
	v.doneGen = gen
	v.mu.Unlock()
	return nil
}

func negativeKey(kh string) string { return negativeKeyPrefix + kh }

// negativeMarker reports whether another miss (on any instance) recently
// found the kid unknown and how long the marker still lives; ok is false
// when there is no Redis or it could not be read.
func (v *Verifier) negativeMarker(ctx context.Context, kh string) (ttl time.Duration, marked, ok bool) {
	if v.cfg.Redis == nil {
		return 0, false, false
	}
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	ttl, err := v.cfg.Redis.PTTL(rctx, negativeKey(kh)).Result()
	if err != nil {
		v.logger.LogAttrs(ctx, levelDebug, "auth: jwks negative cache read failed; using the local limit",
			slog.String("kid_hash", kh), slog.Any("err", err))
		return 0, false, false
	}
	switch {
	case ttl > 0:
		return ttl, true, true
	case ttl == -1: // present without a TTL: should not exist, but it is still a marker
		return v.cfg.NegativeTTL, true, true
	}
	return 0, false, true
}

func (v *Verifier) setNegativeMarker(ctx context.Context, kh string) {
	if v.cfg.Redis == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	err := v.cfg.Redis.Do(rctx, "set", negativeKey(kh), "1", "px", v.cfg.NegativeTTL.Milliseconds()).Err()
	if err != nil {
		v.logger.LogAttrs(ctx, levelDebug, "auth: jwks negative cache write failed",
			slog.String("kid_hash", kh), slog.Any("err", err))
	}
}
