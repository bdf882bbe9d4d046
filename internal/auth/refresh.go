package auth

import (
	"context"
	"log/slog"
	"time"
)

// resolveMiss runs after a token named a kid the key set does not hold. It
// returns once whatever this miss may learn is in the key set (or nothing can
// be learned now, or ctx ends first); the caller then looks the kid up again.
//
// Concurrent misses for one kid share one resolution: the first registers it
// in inflight and starts it, and every miss, the first included, waits for its
// done channel only as long as its own ctx allows. A miss that arrives while
// a refetch runs waits for that refetch; one that arrives less than
// sourceRefetchGap after the last refetch started learns nothing now and
// leaves no trace, so a key published since is found by the first miss after
// the gap.
func (v *Verifier) resolveMiss(ctx context.Context, kid string) {
	if len(kid) > maxKIDBytes {
		return
	}
	now := v.cfg.Now()
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	if m := v.inflight[kid]; m != nil {
		v.mu.Unlock()
		wait(ctx, m.done)
		return
	}
	if until, ok := v.noFetchUntil[kid]; ok && now.Before(until) {
		v.mu.Unlock()
		return
	}
	if f := v.fetch; f != nil && f.running() {
		v.mu.Unlock()
		wait(ctx, f.done)
		return
	}
	if now.Before(v.nextFetch) {
		v.mu.Unlock()
		return
	}
	m := &kidMiss{done: make(chan struct{})}
	v.inflight[kid] = m
	seen := v.fetchGen
	v.resolving.Add(1)
	v.mu.Unlock()

	// Detached from the caller, in its own goroutine: the misses waiting
	// for it must not fail because the first caller went away, and the
	// first caller must not outlive its own deadline because the JWKS
	// endpoint is slow. The values of ctx (log fields) go along.
	rctx := context.WithoutCancel(ctx)
	go func() {
		defer v.resolving.Done()
		v.resolve(rctx, kid, m, seen, now)
	}()
	wait(ctx, m.done)
}

// resolve is the shared resolution of one unknown kid, started at now by
// resolveMiss: the negative marker, then a refetch. It ends within
// missTimeout, or at once when the Verifier is closed, and always closes
// m.done.
func (v *Verifier) resolve(ctx context.Context, kid string, m *kidMiss, seen uint64, now time.Time) {
	defer func() {
		v.mu.Lock()
		delete(v.inflight, kid)
		v.mu.Unlock()
		close(m.done)
	}()
	mctx, cancel := context.WithTimeout(ctx, missTimeout)
	defer cancel()
	defer context.AfterFunc(v.life, cancel)()

	kh := kidHash(kid)
	ttl, marked, redisOK := v.negativeMarker(mctx, kh)
	if marked {
		v.remember(ctx, kid, now, now.Add(ttl))
		v.logger.LogAttrs(ctx, levelDebug, "auth: kid in negative cache", slog.String("kid_hash", kh))
		return
	}
	if err := v.refresh(mctx, seen); err != nil {
		return
	}
	if v.keys.Load().has(kid) {
		v.logger.LogAttrs(ctx, slog.LevelInfo, "auth: jwks refetch found a new kid", slog.String("kid_hash", kh))
		return
	}
	v.remember(ctx, kid, now, now.Add(v.cfg.RefetchInterval))
	if redisOK {
		// After a failed read the write would only add another timeout.
		v.setNegativeMarker(mctx, kh)
	}
	v.logger.LogAttrs(ctx, levelDebug, "auth: kid unknown after refetch", slog.String("kid_hash", kh))
}

// wait blocks until done is closed or ctx ends.
func wait(ctx context.Context, done <-chan struct{}) {
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// remember records that kid, which the JWKS does not hold, causes no refetch
// (nor marker read) before until. The map is bounded: when it is full of fresh
// entries the kid is not remembered, which only costs it the per-kid limit;
// the per-source gap still bounds the fetches.
func (v *Verifier) remember(ctx context.Context, kid string, now, until time.Time) {
	v.mu.Lock()
	if _, ok := v.noFetchUntil[kid]; !ok && len(v.noFetchUntil) >= maxTrackedKIDs {
		for k, u := range v.noFetchUntil {
			if !now.Before(u) {
				delete(v.noFetchUntil, k)
			}
		}
	}
	if _, ok := v.noFetchUntil[kid]; ok || len(v.noFetchUntil) < maxTrackedKIDs {
		v.noFetchUntil[kid] = until
		v.mu.Unlock()
		return
	}
	warn := now.Sub(v.lastFullWarn) >= sourceRefetchGap
	if warn {
		v.lastFullWarn = now
	}
	v.mu.Unlock()
	if warn {
		v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: too many unknown kids to track each; only the per-source refetch limit applies",
			slog.Int("tracked", maxTrackedKIDs))
	}
}

// fetchCall is one JWKS refetch; err is set before done is closed.
type fetchCall struct {
	done chan struct{}
	err  error
}

func (f *fetchCall) running() bool {
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

// refresh reloads the JWKS for a miss that saw fetchGen == seen while no
// refetch ran and the gap had passed. If another miss has started a refetch
// since, that refetch began after this miss and answers it too, so this one
// waits for its result instead of fetching; otherwise it starts the refetch
// and closes the gap for sourceRefetchGap, whatever the outcome, so a failing
// JWKS endpoint is not hammered either. Only the miss that ran a failed
// refetch logs it, so a flood of misses sharing it logs one line.
func (v *Verifier) refresh(ctx context.Context, seen uint64) error {
	v.mu.Lock()
	if v.fetchGen != seen {
		f := v.fetch
		v.mu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &fetchCall{done: make(chan struct{})}
	v.fetch = f
	v.fetchGen++
	v.nextFetch = v.cfg.Now().Add(sourceRefetchGap)
	v.mu.Unlock()

	f.err = v.reload(ctx)
	close(f.done)
	if f.err != nil && v.life.Err() == nil { // a refetch cut short by Close is no failure to report
		v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: jwks refetch failed; keeping the previous keys", slog.Any("err", f.err))
	}
	return f.err
}

// reload fetches and parses the JWKS and swaps the key set in.
func (v *Verifier) reload(ctx context.Context) error {
	ks, err := v.loadJWKS(ctx)
	if err != nil {
		return err
	}
	if ks.n == 0 && v.keys.Load().n > 0 {
		// An empty set from the issuer is far likelier a glitch than a
		// deliberate revocation of every key; dropping all keys would
		// reject every user at once.
		v.logger.LogAttrs(ctx, slog.LevelWarn, "auth: refetched jwks holds no usable key; keeping the previous keys")
		return nil
	}
	v.keys.Store(ks)
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
