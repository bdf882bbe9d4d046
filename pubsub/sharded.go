package pubsub

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
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
// SUNSUBSCRIBE), only that slot's channels move; when it refuses a command
// (MOVED, CLUSTERDOWN), only that command's channels are tried again
// (shard_link.go). A channel that was confirmed before and is confirmed
// again after such a move is handed to OnResync: its traffic may have
// been lost meanwhile.

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
	//     shard again first: that SSUBSCRIBE supersedes it. An SSUBSCRIBE
	//     of it written already is carried out all the same: its
	//     confirmation, for a channel no longer on this shard, queues an
	//     SUNSUBSCRIBE of it here.
	//   - A refused SUNSUBSCRIBE is queued again once the retry time is
	//     due (chanState.retry while unsubscribing).
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
		case st.sent == sentUnsubscribe && st.retry:
			if d := s.unsubscribeAgainLocked(ch, st, now); d > 0 {
				wait = d
				continue
			}
			touched[st.shard] = struct{}{}
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

// unsubscribeAgainLocked queues ch's refused SUNSUBSCRIBE again on its
// shard once the retry time is due; before, it leaves ch dirty and
// returns how long until then.
func (s *Subscriber) unsubscribeAgainLocked(ch string, st *chanState, now time.Time) time.Duration {
	if now.Before(s.retryAt) {
		s.dirty[ch] = struct{}{}
		return max(s.retryAt.Sub(now), time.Millisecond)
	}
	st.retry = false
	st.shard.unsubs[ch] = struct{}{}
	return 0
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
	st.sent, st.confirmed, st.retry = sentUnsubscribe, false, false
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

// shardSession runs sh's connection until it fails. wasUp reports whether
// it had answered a PING.
func (s *Subscriber) shardSession(ctx context.Context, sh *shard) (wasUp bool, err error) {
	sctx, cancel := context.WithCancel(s.limited(ctx))
	defer cancel()
	link := &shardLink{ps: sh.client.SSubscribe(sctx)}
	defer link.ps.Close()
	stop := context.AfterFunc(sctx, func() { _ = link.ps.Close() })
	defer stop()
	// A connection that never answers its first PING is dead as well.
	sh.lastPong.Store(time.Now().UnixNano())
	if err := link.ping(sctx); err != nil {
		return false, err
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	// Anything read shows the connection alive: a PONG, a confirmation,
	// and a message too, since under a flood of messages the PONG waits
	// behind them however well the connection reads. One that reads
	// nothing for CanaryDeadline (a stalled master, a half-open TCP link:
	// its PINGs go unanswered) is ended.
	var lost atomic.Bool
	var heard atomic.Int64
	heard.Store(time.Now().UnixNano())
	goAll(&bg, func() { s.shardFlushLoop(sctx, sh, link) }, func() { s.shardPingLoop(sctx, link) }, func() {
		s.watch(sctx, func() bool {
			return time.Since(time.Unix(0, heard.Load())) > s.cfg.CanaryDeadline
		}, func() { lost.Store(true); cancel() })
	})
	for {
		// No read deadline (see session): a quiet link is ended by the
		// watchdog when its PINGs go unanswered.
		msg, err := link.ps.Receive(sctx)
		var rerr redis.Error
		switch {
		case err != nil && lost.Load():
			return wasUp, errCanaryLost
		case err != nil && (!errors.As(err, &rerr) || sctx.Err() != nil):
			return wasUp, err
		}
		heard.Store(time.Now().UnixNano())
		if err != nil {
			// The answer to one command: it alone was refused.
			cmd := link.refused()
			if cmd == nil {
				return wasUp, errOutOfStep
			}
			if !s.refusedShard(sh, cmd, err) {
				return wasUp, err
			}
			continue
		}
		if err := s.shardReply(sh, link, msg, &wasUp); err != nil {
			return wasUp, err
		}
	}
}

// shardReply applies one message or reply read on sh's connection; an
// error ends the connection.
func (s *Subscriber) shardReply(sh *shard, link *shardLink, msg any, wasUp *bool) error {
	switch m := msg.(type) {
	case *redis.Message:
		s.deliver(m.Channel, m.Payload)
	case *redis.Subscription:
		push, ok := link.confirmation(m.Kind, m.Channel)
		if !ok {
			return errOutOfStep
		}
		s.confirmShard(sh, m.Kind, m.Channel, push)
	case *redis.Pong:
		if !link.pong() {
			return errOutOfStep
		}
		s.pongReceived(sh, m.Payload)
		s.mu.Lock()
		batch := sh.resync
		sh.resync = nil
		s.mu.Unlock()
		if len(batch) > 0 {
			s.onResync(batch)
		}
		if !*wasUp {
			*wasUp = true
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
	return nil
}

func (s *Subscriber) pongReceived(sh *shard, payload string) {
	now := time.Now()
	sh.lastPong.Store(now.UnixNano())
	if sent, err := strconv.ParseInt(payload, 10, 64); err == nil {
		lag := max(now.Sub(time.Unix(0, sent)), 0)
		s.shardLag.WithLabelValues(sh.addr).Set(lag.Seconds())
	}
}

// confirmShard applies an SSUBSCRIBE/SUNSUBSCRIBE confirmation from sh's
// master; push marks an SUNSUBSCRIBE that answers none of the commands
// written: the server dropping the channel because its slot moved away.
func (s *Subscriber) confirmShard(sh *shard, kind, channel string, push bool) {
	s.mu.Lock()
	defer s.wake()
	defer s.mu.Unlock()
	st := s.chans[channel]
	if st == nil || st.shard != sh {
		if kind == "ssubscribe" {
			// The server holds a channel the subscriber no longer has
			// on this connection (taken off it while its SSUBSCRIBE was
			// on the way): it is unsubscribed, unless subscribed here
			// again first (see shard.subs).
			sh.unsubs[channel] = struct{}{}
			sh.wake()
		}
		return
	}
	switch {
	case kind == "ssubscribe":
		s.subscribedLocked(sh, channel, st)
	case !push && st.sent == sentUnsubscribe:
		s.unsubscribedLocked(channel, st)
	case push && st.sent == sentSubscribe:
		// The slot moved away. A replica serves SSUBSCRIBE for its
		// master's slots, so a slot map that still names this node
		// (read from a node the failover has not reached yet) would
		// confirm the channel here again, fed by replication, and
		// nothing would ever move it to the master.
		s.detachLocked(channel, st)
		st.leftAddr, st.leftUntil = sh.addr, time.Now().Add(rds.ClusterSlotMapMaxAge)
		s.reload = true
	}
	// Otherwise: the answer to an SUNSUBSCRIBE written before the
	// channel's SSUBSCRIBE here, whose confirmation follows; or the
	// server ending a subscription whose SUNSUBSCRIBE is on the way,
	// whose answer ends the state.
}

// subscribedLocked applies an SSUBSCRIBE confirmation of ch on sh.
func (s *Subscriber) subscribedLocked(sh *shard, ch string, st *chanState) {
	if st.pendingSubs > 0 {
		st.pendingSubs--
	}
	if st.pendingSubs != 0 || st.sent != sentSubscribe {
		return
	}
	st.confirmed, st.retry, st.leftAddr = true, false, ""
	for _, w := range st.waiters {
		close(w)
	}
	st.waiters = nil
	if st.lost {
		st.lost = false
		if ch != s.canary {
			sh.resync = append(sh.resync, ch)
		}
		s.unlostLocked()
	}
}

// unsubscribedLocked ends an unsubscribing channel's state: the server
// holds it no longer. Every SSUBSCRIBE written before its SUNSUBSCRIBE
// was answered before it.
func (s *Subscriber) unsubscribedLocked(ch string, st *chanState) {
	setShardLocked(st, nil)
	st.sent, st.pendingSubs = sentNone, 0
	if st.refs == 0 {
		s.dropLocked(ch, st)
	} else {
		s.dirty[ch] = struct{}{}
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
