package presence

import (
	"context"
	"log/slog"
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
const (
	// offlineBatchMax bounds the checks of one pipeline.
	offlineBatchMax = 512
	// offlineSlack: checks due this soon after the first one go with it.
	offlineSlack = 10 * time.Millisecond
)

// offlineCheck is one scheduled check; a reconnect cancels it by removing
// it from Presence.pending (it stays in the queue and is skipped).
type offlineCheck struct {
	userID string
	at     time.Time // the disconnect, reported with the transition
	due    time.Time
}

// scheduleOffline checks the user's offline transition after the debounce.
func (p *Presence) scheduleOffline(userID string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.pending[userID] != nil {
		return
	}
	c := &offlineCheck{userID: userID, at: at, due: time.Now().Add(p.cfg.OfflineDebounce)}
	p.pending[userID] = c
	p.due = append(p.due, c)
	if !p.offlineRunning {
		p.offlineRunning = true
		p.inflight.Add(1)
		go p.offlineLoop()
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
		var batch []*offlineCheck
		i := 0
		for ; i < len(p.due) && len(batch) < offlineBatchMax && !p.due[i].due.After(limit); i++ {
			if c := p.due[i]; p.pending[c.userID] == c {
				delete(p.pending, c.userID)
				batch = append(batch, c)
			}
		}
		p.due = p.due[i:]
		if len(p.due) == 0 {
			p.due = nil
		}
		p.checking += len(batch)
		p.mu.Unlock()
		p.runOffline(batch)
		p.mu.Lock()
		p.checking -= len(batch)
		p.mu.Unlock()
	}
}

// runOffline runs a batch of checks in one pipeline and reports the users
// who went offline.
func (p *Presence) runOffline(batch []*offlineCheck) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		for _, c := range batch {
			lua.RTOffline.Run(ctx, pipe, []string{UserConnsKey(c.userID), OnlineKey(c.userID)}, ms(p.cfg.ConnTTL))
		}
	})
	if err != nil {
		p.logger.Warn("presence offline check failed", slog.String("kind", rds.Kind(rds.ClassifyRedisError(err))))
	}
	for i, c := range batch {
		if i >= len(cmds) {
			break
		}
		v, err := cmds[i].(*redis.Cmd).Slice()
		if err != nil || len(v) == 0 {
			continue
		}
		if went, _ := v[0].(int64); went == 1 && p.events != nil {
			p.emit(func(ctx context.Context) { p.events.Offline(ctx, c.userID, c.at) })
		}
	}
}
