package pubsub

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// On a Redis Cluster the subscriber uses sharded Pub/Sub: a channel lives
// on the master that owns its slot, SPUBLISH sends a message to that shard
// only, and the subscriber keeps one SSUBSCRIBE connection per master that
// owns one of its channels. A router assigns every channel to the master
// owning its slot; each shard connection sends SSUBSCRIBE/SUNSUBSCRIBE in
// commands of one slot each (Redis refuses a command whose channels hash
// to several slots). When a shard connection fails (its master died) the
// channels it carried, and only those, go back to the router, which
// reloads the slot map and subscribes them on the new owner; when the
// server ends a subscription itself (the slot moved away: it sends
// SUNSUBSCRIBE) or answers MOVED, only that slot's channels move. A
// channel that was confirmed before and is confirmed again after such a
// move is handed to OnResync: its traffic may have been lost meanwhile.

// shard is the subscriber's connection to one master.
type shard struct {
	addr   string
	client *redis.Client
	// subs and unsubs are the channels whose SSUBSCRIBE or SUNSUBSCRIBE is
	// queued on the connection and not yet written; up is set once the
	// connection answered its first PING. All three are guarded by
	// Subscriber.mu.
	//
	// A flush writes the unsubscribes before the subscribes, and the
	// server answers in the order it was written to. So a channel is never
	// in both: the queue holds at most one command per channel, the one
	// that brings the server to the channel's latest state.
	//   - A channel is in subs only while its state names this shard with
	//     sent == sentSubscribe, and its pendingSubs counts that command.
	//   - An unsubscribe of a channel still in subs takes the SSUBSCRIBE
	//     back (it never reached the server, nothing will confirm it) and
	//     queues the SUNSUBSCRIBE alone, which leaves the server without
	//     the channel whatever an earlier connection state left there; its
	//     confirmation then finds no SSUBSCRIBE outstanding and ends the
	//     state. Queuing it behind the SSUBSCRIBE instead would reach the
	//     server reversed: subscribed, with the state stuck waiting for an
	//     unsubscribe confirmation that had already been ignored.
	//   - A channel whose SUNSUBSCRIBE is queued or written is subscribed
	//     again only once that is confirmed (route), so its next
	//     SSUBSCRIBE goes out in a later flush, after it.
	//   - An SSUBSCRIBE written already is answered before any SUNSUBSCRIBE
	//     queued after it: that confirmation finds the state unsubscribing
	//     and is ignored, and the SUNSUBSCRIBE's ends it.
	//   - Detaching a channel (shard lost, slot moved) takes its queued
	//     SSUBSCRIBE back; a queued SUNSUBSCRIBE still goes out (the server
	//     may hold the channel) and its answer, for a channel no longer on
	//     this shard, is ignored, unless the channel is subscribed on this
	//     shard again first: that SSUBSCRIBE supersedes it.
	subs, unsubs map[string]struct{}
	up           bool
	// chans counts the channels whose state names this shard (st.shard);
	// guarded by Subscriber.mu. A shard without any (its slots moved
	// away) does not count for the subscriber's health.
	chans int
	// live counts those of them that are held and are not the canary
	// (chanState.counted): the channels the shard metric reports, kept
	// here so a scrape does not walk every channel under the lock.
	live int
	// resync holds the lost channels confirmed again, handed to OnResync
	// together at the next PONG (a PING follows every SSUBSCRIBE batch,
	// so it answers after the whole batch is confirmed).
	resync   []string
	kick     chan struct{}
	lastPong atomic.Int64 // unix ns
}

func (sh *shard) wake() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// runSharded is Start's loop on a cluster: it routes dirty channels to
// shards until ctx ends, then waits for the shard goroutines. Channels
// that come back from a failed shard or a moved slot wait for the retry
// time the failure set; new subscriptions never wait for them.
func (s *Subscriber) runSharded(ctx context.Context) {
	var shards sync.WaitGroup
	defer shards.Wait()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.canaryLoop(ctx)
	}()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-retry.C:
		}
		if wait := s.route(ctx, &shards); wait > 0 {
			retry.Reset(wait)
		}
	}
}

// nextBackoffLocked returns the jittered delay before the next routing
// after a failure; grow is false after a link that had been up.
func (s *Subscriber) nextBackoffLocked(grow bool) time.Duration {
	if grow && s.backoff > 0 {
		s.backoff = min(2*s.backoff, s.cfg.ReconnectMax)
	} else {
		s.backoff = s.cfg.ReconnectMin
	}
	return s.backoff/2 + rand.N(s.backoff/2+1)
}

// route assigns the dirty channels: a channel to subscribe goes to the
// shard of the master owning its slot, a channel to release to the shard
// it is on. It returns how long until channels it left for a retry are
// due, or 0.
func (s *Subscriber) route(ctx context.Context, shards *sync.WaitGroup) time.Duration {
	s.mu.Lock()
	// The slot map is read afresh in the pass that routes the channels a
	// failure sent back, not in the passes before, which route only new
	// subscriptions.
	reload := s.reload && !time.Now().Before(s.retryAt)
	if reload {
		s.reload = false
	}
	names := make([]string, 0, len(s.dirty))
	for ch := range s.dirty {
		names = append(names, ch)
	}
	clear(s.dirty)
	s.mu.Unlock()
	if len(names) == 0 {
		return 0
	}
	if reload {
		// ForEachMaster reads the slot map afresh before it iterates.
		_ = s.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
	}
	owners := make(map[string]*redis.Client, len(names))
	for _, ch := range names {
		if c, err := s.cluster.MasterForKey(ctx, ch); err == nil {
			owners[ch] = c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0
	}
	now := time.Now()
	var wait time.Duration
	touched := map[*shard]struct{}{}
	for _, ch := range names {
		st := s.chans[ch]
		switch {
		case st == nil:
		case st.refs > 0 && st.sent == sentUnsubscribe:
			// Subscribed again once its SUNSUBSCRIBE is confirmed, so
			// that confirmation is never taken for the server's own.
		case st.refs > 0 && st.sent == sentNone:
			c := owners[ch]
			if c != nil && s.staleOwnerLocked(st, c, now) {
				c = nil
			}
			if c == nil && !st.retry {
				// The slot map could not be read: retry after a while.
				st.retry = true
				s.retryAt = now.Add(s.nextBackoffLocked(true))
			}
			if c == nil || (st.retry && now.Before(s.retryAt)) {
				s.dirty[ch] = struct{}{}
				s.reload = s.reload || c == nil
				wait = max(s.retryAt.Sub(now), time.Millisecond)
				continue
			}
			sh := s.shardLocked(ctx, shards, c)
			queueSubscribeLocked(sh, ch, st)
			touched[sh] = struct{}{}
		case st.refs == 0 && st.sent == sentSubscribe:
			touched[st.shard] = struct{}{}
			queueUnsubscribeLocked(ch, st)
		case st.refs == 0 && st.sent == sentNone:
			s.dropLocked(ch, st)
		}
	}
	for sh := range touched {
		sh.wake()
	}
	return wait
}

// queueSubscribeLocked puts ch on sh and queues its SSUBSCRIBE there; a
// SUNSUBSCRIBE of it still queued on sh from before it was detached is
// superseded (see shard.subs).
func queueSubscribeLocked(sh *shard, ch string, st *chanState) {
	st.sent, st.confirmed = sentSubscribe, false
	setShardLocked(st, sh)
	st.pendingSubs++
	delete(sh.unsubs, ch)
	sh.subs[ch] = struct{}{}
}

// queueUnsubscribeLocked queues ch's SUNSUBSCRIBE on its shard, taking its
// SSUBSCRIBE back if that was not written yet (see shard.subs).
func queueUnsubscribeLocked(ch string, st *chanState) {
	sh := st.shard
	if _, queued := sh.subs[ch]; queued {
		delete(sh.subs, ch)
		st.pendingSubs--
	}
	st.sent, st.confirmed = sentUnsubscribe, false
	sh.unsubs[ch] = struct{}{}
}

// staleOwnerLocked reports whether c, the owner of st's channel in the
// slot map, is the master that ended the channel's subscription because
// its slot moved away: the map was read from a node the move had not
// reached yet. It is read again for a retry after a backoff.
func (s *Subscriber) staleOwnerLocked(st *chanState, c *redis.Client, now time.Time) bool {
	if st.leftAddr != c.Options().Addr || !now.Before(st.leftUntil) {
		return false
	}
	if !now.Before(s.retryAt) {
		s.retryAt = now.Add(s.nextBackoffLocked(true))
	}
	return true
}

// shardLocked returns the shard of c's master, starting its connection
// if there is none.
func (s *Subscriber) shardLocked(ctx context.Context, shards *sync.WaitGroup, c *redis.Client) *shard {
	addr := c.Options().Addr
	if sh := s.shards[addr]; sh != nil {
		return sh
	}
	if _, ok := s.hooked[c]; !ok {
		// Its Pub/Sub connections read through a bulkLimiter.
		s.hooked[c] = struct{}{}
		c.AddHook(limitHook{})
	}
	sh := &shard{addr: addr, client: c, kick: make(chan struct{}, 1), subs: map[string]struct{}{}, unsubs: map[string]struct{}{}}
	s.shards[addr] = sh
	shards.Add(1)
	go func() {
		defer shards.Done()
		wasUp, err := s.shardSession(ctx, sh)
		s.shardLost(sh, wasUp, err)
	}()
	return sh
}

// setShardLocked moves st onto sh (nil: onto none), keeping the shards'
// channel counts.
func setShardLocked(st *chanState, sh *shard) {
	if st.shard != nil {
		st.shard.chans--
		if st.counted {
			st.shard.live--
		}
	}
	st.shard = sh
	if sh != nil {
		sh.chans++
		if st.counted {
			sh.live++
		}
	}
}

// setCountedLocked marks st held (or no longer), keeping the subscriber's
// and its shard's live counts.
func (s *Subscriber) setCountedLocked(st *chanState, counted bool) {
	if st.counted == counted {
		return
	}
	st.counted = counted
	d := 1
	if !counted {
		d = -1
	}
	s.live.Add(int64(d))
	if st.shard != nil {
		st.shard.live += d
	}
}

// dropLocked forgets a channel nobody holds any more.
func (s *Subscriber) dropLocked(ch string, st *chanState) {
	if st.lost {
		s.unlostLocked()
	}
	delete(s.chans, ch)
}

// unlostLocked counts one lost channel less; with none left no shard is
// reported down any more.
func (s *Subscriber) unlostLocked() {
	s.lostN--
	if s.lostN == 0 {
		clear(s.downShards)
		s.metrics.linkUp.Set(1)
	}
}

// detachLocked takes a channel off its shard: the router subscribes it
// again (on the slot's owner now) if it is still referenced. A channel
// that had been confirmed is marked lost, so its sockets resync once it
// is confirmed again.
func (s *Subscriber) detachLocked(ch string, st *chanState) {
	wasConfirmed := st.confirmed && st.sent == sentSubscribe
	if st.shard != nil {
		delete(st.shard.subs, ch)
	}
	setShardLocked(st, nil)
	st.sent, st.pendingSubs, st.confirmed, st.retry = sentNone, 0, false, true
	if st.refs == 0 {
		s.dropLocked(ch, st)
		return
	}
	if wasConfirmed && !st.lost {
		st.lost = true
		s.lostN++
	}
	s.dirty[ch] = struct{}{}
}

// shardLost hands the channels of a failed shard connection back to the
// router.
func (s *Subscriber) shardLost(sh *shard, wasUp bool, err error) {
	s.mu.Lock()
	if s.shards[sh.addr] == sh {
		delete(s.shards, sh.addr)
	}
	n := 0
	for ch, st := range s.chans {
		if st.shard == sh {
			s.detachLocked(ch, st)
			n++
		}
	}
	if s.lostN > 0 {
		// Reported down until its channels are confirmed elsewhere.
		s.downShards[sh.addr] = struct{}{}
	}
	s.reload = true
	s.retryAt = time.Now().Add(s.nextBackoffLocked(!wasUp))
	closed, lost := s.closed, s.lostN > 0
	s.mu.Unlock()
	if closed {
		return
	}
	// A shard that carried none of the instance's channels (a node that
	// was demoted to replica and then stopped, in a rolling upgrade) costs
	// nothing when it goes: the link stays up. Set down here, nothing
	// would set it up again, since no channel is to be confirmed.
	if n > 0 || lost {
		s.metrics.linkUp.Set(0)
		if wasUp {
			s.metrics.reconnects.Inc()
			s.shardReconnects.WithLabelValues(sh.addr).Inc()
		}
	}
	s.logger.Warn("pubsub shard link lost; moving its channels", slog.String("shard", sh.addr),
		slog.Int("channels", n), slog.String("kind", rds.Kind(err)))
	s.wake()
}

// moveSlot hands the channels of one slot on sh back to the router (the
// server said the slot is elsewhere now). With slot < 0 (the server
// refused a subscription for another reason) it moves the channels on sh
// whose subscription is not confirmed yet, with a growing backoff.
func (s *Subscriber) moveSlot(sh *shard, slot int, cause error) {
	if slot < 0 {
		s.logger.Warn("pubsub shard refused a subscription; retrying", slog.String("shard", sh.addr),
			slog.String("kind", rds.Kind(cause)))
	}
	s.mu.Lock()
	for ch, st := range s.chans {
		if st.shard != sh || (slot >= 0 && rds.Slot(ch) != slot) || (slot < 0 && st.confirmed) {
			continue
		}
		s.detachLocked(ch, st)
	}
	s.reload = true
	s.retryAt = time.Now().Add(s.nextBackoffLocked(slot < 0))
	s.mu.Unlock()
	s.wake()
}

// shardSession runs sh's connection until it fails. wasUp reports whether
// it had answered a PING.
func (s *Subscriber) shardSession(ctx context.Context, sh *shard) (wasUp bool, err error) {
	sctx, cancel := context.WithCancel(s.limited(ctx))
	defer cancel()
	ps := sh.client.SSubscribe(sctx)
	defer ps.Close()
	stop := context.AfterFunc(sctx, func() { _ = ps.Close() })
	defer stop()
	// A connection that never answers its first PING is dead as well.
	sh.lastPong.Store(time.Now().UnixNano())
	if err := ps.Ping(sctx, strconv.FormatInt(time.Now().UnixNano(), 10)); err != nil {
		return false, err
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	var lost atomic.Bool
	goAll(&bg, func() { s.shardFlushLoop(sctx, sh, ps) }, func() { s.shardPingLoop(sctx, ps) }, func() {
		s.watch(sctx, func() bool {
			return time.Since(time.Unix(0, sh.lastPong.Load())) > s.cfg.CanaryDeadline
		}, func() { lost.Store(true); cancel() })
	})
	for {
		// No read deadline (see session): a quiet link is ended by the
		// watchdog when its PINGs go unanswered.
		msg, err := ps.Receive(sctx)
		if err != nil {
			if lost.Load() {
				return wasUp, errCanaryLost
			}
			var rerr redis.Error
			if errors.As(err, &rerr) && sctx.Err() == nil {
				// The answer to one SSUBSCRIBE: MOVED names the slot
				// that is elsewhere now; anything else (CLUSTERDOWN
				// while a failover runs) concerns the commands not yet
				// confirmed.
				s.moveSlot(sh, movedSlot(rerr.Error()), err)
				continue
			}
			return wasUp, err
		}
		switch m := msg.(type) {
		case *redis.Message:
			s.deliver(m.Channel, m.Payload)
		case *redis.Subscription:
			s.confirmShard(sh, m.Kind, m.Channel)
		case *redis.Pong:
			s.pongReceived(sh, m.Payload)
			s.mu.Lock()
			batch := sh.resync
			sh.resync = nil
			s.mu.Unlock()
			if len(batch) > 0 {
				s.onResync(batch)
			}
			if !wasUp {
				wasUp = true
				s.mu.Lock()
				sh.up = true
				s.backoff = 0
				whole := s.lostN == 0
				s.mu.Unlock()
				if whole {
					s.metrics.linkUp.Set(1)
				}
				sh.wake()
			}
		}
	}
}

// movedSlot is the slot of a "MOVED <slot> <addr>" or "ASK <slot> <addr>"
// error, or -1.
func movedSlot(msg string) int {
	f := strings.Fields(msg)
	if len(f) >= 2 && (f[0] == "MOVED" || f[0] == "ASK") {
		if n, err := strconv.Atoi(f[1]); err == nil {
			return n
		}
	}
	return -1
}

func (s *Subscriber) pongReceived(sh *shard, payload string) {
	now := time.Now()
	sh.lastPong.Store(now.UnixNano())
	if sent, err := strconv.ParseInt(payload, 10, 64); err == nil {
		lag := max(now.Sub(time.Unix(0, sent)), 0)
		s.shardLag.WithLabelValues(sh.addr).Set(lag.Seconds())
	}
}

// confirmShard applies an SSUBSCRIBE/SUNSUBSCRIBE from sh's master. An
// SUNSUBSCRIBE nobody asked for is the server dropping the channel because
// its slot moved away.
func (s *Subscriber) confirmShard(sh *shard, kind, channel string) {
	s.mu.Lock()
	st := s.chans[channel]
	if st == nil || st.shard != sh {
		s.mu.Unlock()
		return
	}
	switch kind {
	case "ssubscribe":
		if st.pendingSubs > 0 {
			st.pendingSubs--
		}
		if st.pendingSubs == 0 && st.sent == sentSubscribe {
			st.confirmed, st.retry, st.leftAddr = true, false, ""
			for _, w := range st.waiters {
				close(w)
			}
			st.waiters = nil
			if st.lost {
				st.lost = false
				if channel != s.canary {
					sh.resync = append(sh.resync, channel)
				}
				s.unlostLocked()
			}
		}
	case "sunsubscribe":
		switch {
		case st.sent == sentUnsubscribe && st.pendingSubs == 0:
			setShardLocked(st, nil)
			st.sent = sentNone
			if st.refs == 0 {
				s.dropLocked(channel, st)
			} else {
				s.dirty[channel] = struct{}{}
			}
		case st.sent == sentSubscribe:
			// The slot moved away. A replica serves SSUBSCRIBE for its
			// master's slots, so a slot map that still names this node
			// (read from a node the failover has not reached yet) would
			// confirm the channel here again, fed by replication, and
			// nothing would ever move it to the master.
			s.detachLocked(channel, st)
			st.leftAddr, st.leftUntil = sh.addr, time.Now().Add(rds.ClusterSlotMapMaxAge)
			s.reload = true
		}
	}
	s.mu.Unlock()
	s.wake()
}

// shardFlushLoop sends the SSUBSCRIBE/SUNSUBSCRIBE commands the router
// queued on sh, one command per slot.
func (s *Subscriber) shardFlushLoop(ctx context.Context, sh *shard, ps *redis.PubSub) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sh.kick:
		}
		s.mu.Lock()
		if !sh.up {
			s.mu.Unlock()
			continue
		}
		subs, unsubs := sh.subs, sh.unsubs
		sh.subs, sh.unsubs = map[string]struct{}{}, map[string]struct{}{}
		s.mu.Unlock()
		err := s.sendBySlot(ctx, ps, false, unsubs)
		if err == nil && len(subs) > 0 {
			err = s.sendBySlot(ctx, ps, true, subs)
			if err == nil {
				err = ps.Ping(ctx, strconv.FormatInt(time.Now().UnixNano(), 10))
			}
		}
		if err != nil {
			_ = ps.Close()
			return
		}
	}
}

func (s *Subscriber) sendBySlot(ctx context.Context, ps *redis.PubSub, sub bool, channels map[string]struct{}) error {
	bySlot := map[int][]string{}
	for ch := range channels {
		slot := rds.Slot(ch)
		bySlot[slot] = append(bySlot[slot], ch)
	}
	for _, group := range bySlot {
		for len(group) > 0 {
			n := min(len(group), s.cfg.BatchSize)
			var err error
			if sub {
				err = ps.SSubscribe(ctx, group[:n]...)
			} else {
				err = ps.SUnsubscribe(ctx, group[:n]...)
			}
			if err != nil {
				return err
			}
			group = group[n:]
		}
	}
	return nil
}

func (s *Subscriber) shardPingLoop(ctx context.Context, ps *redis.PubSub) {
	t := time.NewTicker(s.cfg.CanaryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = ps.Ping(ctx, strconv.FormatInt(time.Now().UnixNano(), 10))
	}
}

// shardedHealthy: the canary came back recently, every shard connection
// carrying a channel answers its PINGs, and no channel waits to be
// subscribed again after a shard failure or a slot move. A connection
// whose channels all moved away (its master was demoted) counts for
// nothing: it may stall or die without any channel being lost.
func (s *Subscriber) shardedHealthy() bool {
	if time.Since(time.Unix(0, s.lastCanary.Load())) > s.cfg.CanaryDeadline {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lostN > 0 {
		return false
	}
	for _, sh := range s.shards {
		if sh.chans == 0 {
			continue
		}
		if !sh.up || time.Since(time.Unix(0, sh.lastPong.Load())) > s.cfg.CanaryDeadline {
			return false
		}
	}
	return true
}
