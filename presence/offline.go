package presence

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Debounced offline checks. A user left with no live connection is checked
// OfflineDebounce later; the debounce is the same for everyone, so the
// checks fall due in the order they were scheduled and wait in one FIFO
// queue with one goroutine and one timer, not a timer each. Checks that
// fall due together (the users of a drain, of a dead instance's sweep) go
// out as one pipeline per offlineBatchMax users.
//
// A check lives in this instance's memory, so it is also listed in the
// instance's index, as the member "<user_id>:~offline" (offlineConnID: a
// connection id is a UUID, never that), scored with Redis's time of the
// listing. Should the instance die before the check runs, the survivor
// that sweeps the index runs it instead (and lists it in its own index
// first). The member goes once the check got its answer, was given up, or
// was cancelled by a reconnect (when its turn comes); a member left over
// only costs a survivor one check that announces nothing. Removals compare
// the score, so they never take a member a later check listed again.
const (
	// offlineBatchMax bounds the checks of one pipeline.
	offlineBatchMax = 512
	// offlineSlack: checks due this soon after the first one go with it.
	offlineSlack = 10 * time.Millisecond
	// offlineRetryFirst and offlineRetryMax bound the pause before a
	// failed check runs again (doubling in between). A failed check is
	// retried until the user's online marker would have expired anyway
	// (UserTTL after the disconnect): past that there is nothing left to
	// announce.
	offlineRetryFirst = 250 * time.Millisecond
	offlineRetryMax   = 5 * time.Second
)

// offlineConnID is the connection-id part of an offline check's index member.
const offlineConnID = "~offline"

// offlineMember is the index member of userID's offline check.
func offlineMember(userID string) string { return userID + ":" + offlineConnID }

// offlineCheck is one scheduled check; a reconnect cancels it, and a later
// disconnect replaces it, by removing it from Presence.pending (it stays in
// the queue and is skipped).
type offlineCheck struct {
	userID string
	// at is Redis's time of the disconnect, the transition's time unless
	// a connection came and went after it (rt_offline); zero when Redis
	// did not record the disconnect: the check's own time then (never
	// this instance's clock, which may be off).
	at    time.Time
	due   time.Time
	until time.Time     // no retry after this
	retry time.Duration // the pause before the next retry
	// token tells Redis a retry from another check: a retry whose earlier
	// run deleted the marker (the reply was lost) still reports it.
	token string
	// score is the score of the check's member in this instance's index;
	// 0 while it is not listed there (nor needs to be: a drain's checks,
	// whose connections the index still lists).
	score int64
}

// scheduleOffline checks the user's offline transition after the debounce.
// The debounce runs from the user's last disconnect: a check already
// pending is replaced by this one (the old one stays in the queue and is
// skipped).
// score: see offlineCheck.
func (p *Presence) scheduleOffline(userID string, at time.Time, score int64) {
	p.scheduleOfflineIn(userID, at, p.cfg.OfflineDebounce, score)
}

// scheduleOfflineIn checks the user's offline transition after wait,
// replacing a check already pending.
func (p *Presence) scheduleOfflineIn(userID string, at time.Time, wait time.Duration, score int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	now := time.Now()
	c := &offlineCheck{userID: userID, at: at, due: now.Add(wait),
		until: now.Add(p.cfg.UserTTL), retry: offlineRetryFirst, token: strconv.FormatUint(rand.Uint64(), 36), score: score}
	p.pending[userID] = c
	p.queueLocked(c)
}

// queueLocked puts checks that share one due time into the queue, in due
// order (p.mu held). New checks mostly have the same debounce and go last;
// retried ones and those after a failed removal may go elsewhere.
func (p *Presence) queueLocked(cs ...*offlineCheck) {
	due := cs[0].due
	i := len(p.due)
	for i > 0 && p.due[i-1].due.After(due) {
		i--
	}
	p.due = slices.Insert(p.due, i, cs...)
	if !p.offlineRunning {
		p.offlineRunning = true
		p.inflight.Add(1)
		go p.offlineLoop()
	} else if i == 0 {
		// The loop waits for what was first: wake it.
		select {
		case p.offlineWake <- struct{}{}:
		default:
		}
	}
}

// retryOffline queues the checks that got no answer again, each after its
// pause, unless the user was checked again meanwhile (a later disconnect)
// or the check's time is up; it returns those given up.
func (p *Presence) retryOffline(failed []*offlineCheck) (dropped []*offlineCheck) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		// Their index members stay for the survivors (Deregister).
		p.checksDropped = p.checksDropped || len(failed) > 0
		return nil
	}
	// Checks of one batch share a pause; bunched by pause they keep the
	// queue in due order.
	byPause := map[time.Duration][]*offlineCheck{}
	var pauses []time.Duration
	for _, c := range failed {
		if p.pending[c.userID] != nil || now.Add(c.retry).After(c.until) {
			dropped = append(dropped, c)
			continue
		}
		c.due = now.Add(c.retry)
		if byPause[c.retry] == nil {
			pauses = append(pauses, c.retry)
		}
		byPause[c.retry] = append(byPause[c.retry], c)
		c.retry = min(2*c.retry, offlineRetryMax)
		p.pending[c.userID] = c
	}
	for _, d := range pauses {
		p.queueLocked(byPause[d]...)
	}
	return dropped
}

// removalFailed follows a removal of conns that got no answer: it is done
// again later (the retake queue), whose success schedules the offline
// checks as usual; and should Redis not answer before the connections go
// stale (ConnTTL), their users are checked then anyway, the transition
// stamped with the check's time.
func (p *Presence) removalFailed(conns []Conn) {
	p.retakeLater(conns, false)
	for i, c := range conns {
		if i == 0 || conns[i-1].UserID != c.UserID {
			p.scheduleOfflineIn(c.UserID, time.Time{}, p.cfg.ConnTTL+p.cfg.OfflineDebounce, 0)
		}
	}
}

func (p *Presence) cancelOffline(userID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, userID)
}

// offlineLoop runs the checks as they fall due and exits when none is
// left (scheduleOffline starts it again) or on Close.
func (p *Presence) offlineLoop() {
	defer p.inflight.Done()
	for {
		p.mu.Lock()
		if p.closed || len(p.due) == 0 {
			p.offlineRunning = false
			p.mu.Unlock()
			return
		}
		if wait := time.Until(p.due[0].due); wait > 0 {
			p.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.offlineWake:
				t.Stop()
			}
			continue
		}
		limit := time.Now().Add(offlineSlack)
		var batch, skipped []*offlineCheck
		i := 0
		for ; i < len(p.due) && len(batch) < offlineBatchMax && !p.due[i].due.After(limit); i++ {
			if c := p.due[i]; p.pending[c.userID] == c {
				delete(p.pending, c.userID)
				batch = append(batch, c)
			} else if c.score != 0 {
				skipped = append(skipped, c) // cancelled or replaced
			}
		}
		p.due = p.due[i:]
		if len(p.due) == 0 {
			p.due = nil
		}
		p.checking += len(batch)
		p.mu.Unlock()
		failed := p.runOffline(batch)
		p.unlist(append(skipped, p.retryOffline(failed)...))
		p.mu.Lock()
		p.checking -= len(batch)
		p.mu.Unlock()
	}
}

// runOffline runs a batch of checks in one pipeline, reports the users
// who went offline and returns the checks that got no answer.
func (p *Presence) runOffline(batch []*offlineCheck) (failed []*offlineCheck) {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		for _, c := range batch {
			args := []any{ms(p.cfg.ConnTTL), c.token, ms(p.cfg.UserTTL)}
			if !c.at.IsZero() {
				args = append(args, c.at.UnixMilli())
			}
			lua.RTOffline.Run(ctx, pipe, []string{UserConnsKey(c.userID), OnlineKey(c.userID), OfflineKey(c.userID)}, args...)
		}
	})
	if err != nil {
		p.logger.Warn("presence offline check failed", slog.String("kind", rds.Kind(rds.ClassifyRedisError(err))))
	}
	var gone []string // users whose check deleted the online marker
	var answered []*offlineCheck
	for i, c := range batch {
		if i >= len(cmds) {
			failed = append(failed, c)
			continue
		}
		v, err := lua.Reply(cmds[i]).Slice()
		if err != nil || len(v) == 0 {
			failed = append(failed, c)
			continue
		}
		answered = append(answered, c)
		if went, _ := v[0].(int64); went == 1 {
			gone = append(gone, c.userID)
			at := c.at
			if len(v) > 2 {
				if atMs, ok := v[2].(int64); ok {
					at = time.UnixMilli(atMs)
				}
			}
			if p.events != nil {
				p.emitDecided(c.userID, func(ctx context.Context) { p.events.Offline(ctx, c.userID, at) })
			}
		}
	}
	if len(gone) > 0 {
		// These checks got their answer and will not run again: their
		// records are not needed (they would expire with UserTTL).
		if _, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, u := range gone {
				pipe.Del(ctx, OfflineKey(u))
			}
			return nil
		}); err != nil {
			p.logger.Warn("presence: removing offline check records failed", slog.String("kind", rds.Kind(rds.ClassifyRedisError(err))))
		}
	}
	p.unlist(answered)
	return failed
}

// unlist removes the index members of checks that are done with (answered,
// given up, cancelled or replaced), each only while its score is the one
// the check listed: a later check of the same user listed it again with a
// later score (and a member that a pending check listed at the same score
// or later stays too: that check removes it).
func (p *Presence) unlist(checks []*offlineCheck) {
	p.mu.Lock()
	args := make([]any, 0, 2*len(checks))
	for _, c := range checks {
		if c.score == 0 {
			continue
		}
		if q := p.pending[c.userID]; q != nil && q.score >= c.score {
			continue
		}
		args = append(args, offlineMember(c.userID), strconv.FormatInt(c.score, 10))
	}
	p.mu.Unlock()
	if len(args) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		lua.RTIndexRemove.Run(ctx, pipe, []string{InstanceConnsKey(p.cfg.InstanceID)}, args...)
	}); err != nil {
		p.logger.Warn("presence: removing offline checks' index entries failed", slog.String("kind", rds.Kind(rds.ClassifyRedisError(err))))
	}
}

// listOffline lists users' offline checks in this instance's index (one
// member each, scored with Redis's time, which it returns), removing the
// members remove in the same call.
func (p *Presence) listOffline(ctx context.Context, c redis.Scripter, users []string, remove []string) *redis.Cmd {
	args := make([]any, 0, 2+len(remove)+len(users))
	args = append(args, ms(p.cfg.RegistryTTL), len(remove))
	for _, m := range remove {
		args = append(args, m)
	}
	for _, u := range users {
		args = append(args, offlineMember(u))
	}
	return lua.RTIndexUpdate.Run(ctx, c, []string{InstanceConnsKey(p.cfg.InstanceID)}, args...)
}

// adopt gives the listing of users' checks (score) to their pending
// checks; the members of users without one (a check that already ran, a
// user still live) are removed.
func (p *Presence) adopt(users []string, score int64) {
	var stray []*offlineCheck
	p.mu.Lock()
	for _, u := range users {
		if c := p.pending[u]; c != nil {
			// A listing's reply may come after a later listing's (two
			// disconnect pipelines run at once): the member holds the
			// latest score, and so must the check that removes it.
			c.score = max(c.score, score)
		} else {
			stray = append(stray, &offlineCheck{userID: u, score: score})
		}
	}
	p.mu.Unlock()
	p.unlist(stray)
}
