package presence

import (
	"context"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/han-app/gateway/store/rds"
)

// Start runs the background work until Close: the instance liveness
// refresh, the periodic heartbeat of every connection conns returns, and
// the sweeper. Call it before the first Connect: it first clears, within a
// short bound, what a previous life of this instance id left in its index.
func (p *Presence) Start(conns func() []Conn) {
	p.mu.Lock()
	if p.started || p.closed {
		p.mu.Unlock()
		return
	}
	p.started = true
	p.mu.Unlock()
	// Without p.mu: clearing the previous life schedules the offline
	// checks of its users, which take p.mu.
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	if _, _, err := p.sweepInstance(sctx, p.cfg.InstanceID, 1000, false); err != nil {
		p.logger.Warn("presence: clearing this instance's previous index failed", slog.String("kind", rds.Kind(err)))
	}
	scancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.inflight.Add(3)
	go func() {
		defer p.inflight.Done()
		p.livenessLoop(ctx, conns)
	}()
	go func() {
		defer p.inflight.Done()
		p.refreshLoop(ctx, conns)
	}()
	go func() {
		defer p.inflight.Done()
		p.every(ctx, p.cfg.SweepInterval, func(ctx context.Context) {
			if _, err := p.Sweep(ctx); err != nil {
				p.logger.Warn("presence sweep failed", slog.String("kind", rds.Kind(err)))
			}
		})
	}()
}

func (p *Presence) livenessLoop(ctx context.Context, conns func() []Conn) {
	first := true
	p.every(ctx, p.cfg.LivenessInterval, func(ctx context.Context) {
		lapsed, err := p.RefreshLiveness(ctx)
		if err != nil {
			p.logger.Warn("instance liveness refresh failed", slog.String("kind", rds.Kind(err)))
			return
		}
		// A connect batch or a heartbeat may have found the marker gone
		// first and set it again.
		lapsed = p.markerLapsed.Swap(false) || lapsed
		if lapsed && !first {
			// Survivors may have swept us: put every connection back now
			// rather than at the next periodic heartbeat.
			p.logger.Warn("instance liveness marker had expired; re-registering connections")
			if err := p.Refresh(ctx, conns()); err != nil {
				p.logger.Warn("presence heartbeat failed", slog.String("kind", rds.Kind(err)))
				p.markerLapsed.Store(true) // not done: the next tick tries again
			}
		}
		first = false
	})
}

// refreshSlices is how many parts the connections' heartbeats are spread
// over: every RefreshInterval/refreshSlices one part runs, so each
// connection's heartbeat still runs once per interval but the scripts never
// arrive at Redis as one burst (which would queue behind them the Pub/Sub
// traffic sharing that Redis).
const refreshSlices = 10

// minRefreshTick bounds how often a part runs (short test intervals get
// fewer parts).
const minRefreshTick = 50 * time.Millisecond

// refreshLoop runs the connections' heartbeats, one part of them per tick:
// a connection belongs to part hash(connection id) mod the number of parts.
func (p *Presence) refreshLoop(ctx context.Context, conns func() []Conn) {
	slices := max(1, min(refreshSlices, int(p.cfg.RefreshInterval/minRefreshTick)))
	tick := 0
	p.every(ctx, p.cfg.RefreshInterval/time.Duration(slices), func(ctx context.Context) {
		part := tick % slices
		tick++
		all := conns()
		mine := all[:0:0]
		for _, c := range all {
			if refreshPart(c.ConnID, slices) == part {
				mine = append(mine, c)
			}
		}
		if err := p.Refresh(ctx, mine); err != nil {
			p.logger.Warn("presence heartbeat failed", slog.String("kind", rds.Kind(err)))
		}
	})
}

// refreshPart is the part of the heartbeat spread connID belongs to.
func refreshPart(connID string, slices int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(connID))
	return int(h.Sum32() % uint32(slices))
}

// every runs fn now and then every interval (±10% jitter) until ctx ends:
// after each run it sleeps at least 0.9 × interval and at most
// maxSleep(interval).
func (p *Presence) every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		fn(rctx)
		cancel()
		lo, spread := sleepRange(interval)
		t := time.NewTimer(addSat(lo, p.jitter(spread)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// jitter is a duration in [0, spread]: Config.Jitter's, or uniformly
// random.
func (p *Presence) jitter(spread time.Duration) time.Duration {
	if p.cfg.Jitter == nil {
		return rand.N(spread + 1)
	}
	return min(max(p.cfg.Jitter(spread), 0), spread)
}

// sleepRange is every's sleep between two runs of fn: lo plus a jitter
// drawn from [0, spread], lo being 0.9 × interval and spread 0.2 × interval.
// Neither is computed as interval × 9 (which wraps negative from about
// 284,700 h on, and the loop then ran back to back), and maxSleep and
// every's draw add them with addSat, so no interval makes the loop spin
// (the configuration keeps the intervals to a day anyway). MaxLivenessGap
// is maxSleep of the liveness loop's interval: the two stay one formula.
func sleepRange(interval time.Duration) (lo, spread time.Duration) {
	interval = max(interval, 0)
	return interval - interval/10, interval / 5
}

// maxSleep is the longest sleep of every between two runs of fn.
func maxSleep(interval time.Duration) time.Duration { return addSat(sleepRange(interval)) }

// addSat is a + b for durations of at least 0, at most the longest duration.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// MaxLivenessGap is the longest time between two refreshes of a running
// instance's liveness marker (its liveness interval a third of
// livenessTTL, the loop's longest sleep), not counting the refreshes' own
// round trips to Redis. An idle instance refreshes it no more often than
// that; connections' heartbeats refresh it in between.
func MaxLivenessGap(livenessTTL time.Duration) time.Duration { return maxSleep(livenessTTL / 3) }

// emit runs fn for userID on a tracked goroutine (transition callbacks
// must not hold up the connection that caused them). One user's
// callbacks run one at a time, in the order they were emitted: an offline
// transition whose callback does more work (it records last seen in
// PostgreSQL) must not reach the user's dialogs after the online one that
// followed it.
func (p *Presence) emit(userID string, fn func(ctx context.Context)) { p.emitAfter(userID, fn, false) }

// emitDecided is emit for a transition Redis has already made (an offline
// check's answer), called from a goroutine Close waits for: it runs even
// when Close has begun, so the instance never leaves a user shown online
// whose marker it removed. Emits from elsewhere stop at Close.
func (p *Presence) emitDecided(userID string, fn func(ctx context.Context)) {
	p.emitAfter(userID, fn, true)
}

// emitAfter is emit; decided: see emitDecided. (The caller of a decided
// emit holds an in-flight count, so adding one here never races with
// Close's wait.)
func (p *Presence) emitAfter(userID string, fn func(ctx context.Context), decided bool) {
	p.mu.Lock()
	if p.closed && !decided {
		p.mu.Unlock()
		return
	}
	if q, ok := p.emitting[userID]; ok {
		p.emitting[userID] = append(q, fn)
		p.mu.Unlock()
		return
	}
	p.emitting[userID] = []func(ctx context.Context){fn}
	p.inflight.Add(1)
	p.mu.Unlock()
	if !p.emitters.TryRun(userID) {
		go p.runEmits(userID)
	}
}

// emitWorkers bounds the goroutines that run transition callbacks and keep
// their stacks between users: a callback reads the user's dialogs in
// PostgreSQL and queues a publish per dialog on the publisher's shared
// Redis pipelines, deep enough that a fresh goroutine grew its stack two or
// three times for every user coming online in a connect storm. A callback
// waits a few milliseconds for the read and the pipelines it shares with
// others' (the publishes of one callback go out together, not one round
// trip after another), so a storm of 4,000 connections a second keeps
// dozens running at once, and more in bursts (at 64, half of a storm's
// callbacks still found every worker busy). Beyond them a callback runs on
// a goroutine of its own. Idle workers exit after two seconds.
const emitWorkers = 256

// runEmits runs the user's queued transition callbacks in order until the
// queue is empty (emitAfter queued the first and counted the run in
// inflight).
func (p *Presence) runEmits(userID string) {
	defer p.inflight.Done()
	for {
		p.mu.Lock()
		q := p.emitting[userID]
		if len(q) == 0 {
			delete(p.emitting, userID)
			p.mu.Unlock()
			return
		}
		fn := q[0]
		q[0] = nil
		p.emitting[userID] = q[1:]
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(p.emitLife, 5*time.Second)
		fn(ctx)
		cancel()
	}
}

// Shutdown stops the background loops but lets pending offline checks run
// at their time (so users of a draining instance who do not come back
// elsewhere are reported offline), waits for them at most wait and never
// past ctx, then closes (Close waits for the transition callbacks already
// running). A callback still running when ctx ends is cut: the instance's
// shutdown has one deadline, which a stalled PostgreSQL must not hold it
// past (the checks not run stay in the index for the survivors,
// Deregister). Only ctx cuts: the end of wait stops the wait for pending
// checks, not the callbacks telling other instances a user went offline.
func (p *Presence) Shutdown(ctx context.Context, wait time.Duration) {
	stopCut := context.AfterFunc(ctx, p.cutEmits)
	defer stopCut()
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	until := time.Now().Add(wait)
	for {
		p.mu.Lock()
		n := len(p.pending) + p.checking
		p.mu.Unlock()
		if n == 0 || !time.Now().Before(until) {
			break
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			p.Close()
			return
		case <-t.C:
		}
	}
	p.Close()
}

// Close stops the background work, drops pending offline checks (their
// index members stay: should the instance stop for good, the survivors run
// them) and waits for running callbacks. It removes nothing from Redis
// (Deregister does).
// Idempotent.
func (p *Presence) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	// Their index members stay for the survivors (Deregister).
	p.checksDropped = p.checksDropped || len(p.pending) > 0
	clear(p.pending)
	p.due = nil
	cancel := p.cancel
	p.mu.Unlock()
	select {
	case p.offlineWake <- struct{}{}:
	default:
	}
	p.retakeLoop.Close()
	if cancel != nil {
		cancel()
	}
	p.inflight.Wait()
	p.emitters.Close()
	p.cutEmits()
}
