package main

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/store/rds"
)

// instanceIDPoll is how often checkInstanceID reads the liveness marker
// while it waits for a refresh.
const instanceIDPoll = 100 * time.Millisecond

// errInstanceIDInUse refuses a start while another running instance
// refreshes the liveness marker of the same HAN_INSTANCE_ID.
var errInstanceIDInUse = errors.New("HAN_INSTANCE_ID: another running instance uses this id (its liveness marker is being refreshed): " +
	"give every instance its own id, or leave it unset")

// checkInstanceID refuses to start while another running instance uses
// this HAN_INSTANCE_ID. Starting would clear that instance's connections
// from presence (what a previous life of the id left) and share its
// liveness marker and index from then on. The marker is claimed first: set
// only if absent, so of instances starting with one id at once exactly one
// takes it and starts; the others find it, like one left by a running
// instance or a crashed one. A live instance refreshes its marker every
// third of HAN_INSTANCE_LIVENESS_TTL, +10% jitter (the one that claimed it
// does so as it starts); so a marker found is watched for the longest gap
// between two refreshes (instanceIDWindow), less the time since its last
// refresh, and a change means another owner. No marker (a clean stop), or
// one not refreshed for that long (a crash), starts at once; so does an
// instance that cannot reach Redis now (it starts degraded).
func (m *Main) checkInstanceID(ctx context.Context) error {
	cfg := m.Config
	key := presence.InstanceKey(cfg.InstanceID)
	window := instanceIDWindow(cfg.InstanceLivenessTTL, cfg.RedisTimeout)
	read := func() (string, error) {
		rctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		defer cancel()
		return m.rt.Get(rctx, key).Result()
	}
	claimed, err := m.claimInstanceID(ctx, key)
	if err != nil {
		m.Logger.Warn("HAN_INSTANCE_ID not checked for another running instance: Redis did not answer", slog.String("kind", rds.Kind(err)))
		return nil
	}
	if claimed {
		return nil
	}
	first, err := read()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			m.Logger.Warn("HAN_INSTANCE_ID not checked for another running instance: Redis did not answer", slog.String("kind", rds.Kind(err)))
		}
		return nil
	}
	// The marker holds the Redis time of its last refresh, in ms.
	wait := window
	if last, perr := strconv.ParseInt(first, 10, 64); perr == nil {
		rctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		now, terr := m.rt.Time(rctx).Result()
		cancel()
		if terr == nil {
			wait = window - now.Sub(time.UnixMilli(last))
		}
	}
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(instanceIDPoll):
		}
		v, err := read()
		switch {
		case errors.Is(err, redis.Nil):
			return nil
		case err != nil:
			m.Logger.Warn("HAN_INSTANCE_ID not checked for another running instance: Redis did not answer", slog.String("kind", rds.Kind(err)))
			return nil
		case v != first:
			return errInstanceIDInUse
		}
	}
	return nil
}

// instanceIDWindow is how long after a marker's last refresh
// checkInstanceID waits for the next one: the longest sleep of the owner's
// liveness loop (an idle instance refreshes it only from there), the
// refresh's own round trip (bounded by the Redis timeout) and one poll
// step. 4.8 s at the defaults (TTL 10 s, Redis timeout 1 s).
func instanceIDWindow(livenessTTL, redisTimeout time.Duration) time.Duration {
	return presence.MaxLivenessGap(livenessTTL) + redisTimeout + instanceIDPoll
}

// claimInstanceID sets the liveness marker if it is absent. Its value is a
// claim, not a refresh time (a refresh writes Redis's time in ms), so the
// instance's first refresh always changes it, even within the same
// millisecond: another instance that found the claim sees that change. A
// claim outlives a start that fails before its first refresh by at most
// HAN_INSTANCE_LIVENESS_TTL.
func (m *Main) claimInstanceID(ctx context.Context, key string) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, m.Config.RedisTimeout)
	defer cancel()
	return m.rt.SetNX(rctx, key, "claimed:"+rand.Text(), m.Config.InstanceLivenessTTL).Result()
}
