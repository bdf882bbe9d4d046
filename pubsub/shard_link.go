package pubsub

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// A shard connection keeps the record of the commands written on it and
// not fully answered yet, in the order written. The server answers a
// connection's commands in that order (an SSUBSCRIBE or SUNSUBSCRIBE with
// one confirmation per channel, or one error for the whole command), so
// every reply names the command it answers: an error concerns that command
// alone, and the commands written after it are still carried out. The
// subscriber's view of what the connection holds on the server follows
// the replies: a channel is taken for refused only when the command that
// carried it was answered with an error, never because another command
// was.

// What a written command was.
const (
	cmdPing int8 = iota
	cmdSubscribe
	cmdUnsubscribe
)

// sentCmd is one command written on a shard connection; left holds its
// channels whose confirmation has not come yet.
type sentCmd struct {
	kind int8
	left map[string]struct{}
}

// shardLink is one shard connection and its record of the commands
// written on it. Safe for concurrent use.
type shardLink struct {
	ps *redis.PubSub
	// wmu is held across a write and its record, so the record is in the
	// order the commands went out. The reader never takes it: a write that
	// blocks on a stalled server must not hold up the reads that drain it.
	wmu  sync.Mutex
	mu   sync.Mutex // guards sent
	sent []*sentCmd
}

// errOutOfStep ends a shard connection that sent a reply none of the
// commands written on it expects: what the server holds on it is no
// longer known, so only a new connection is sure of it.
var errOutOfStep = rds.Named("pubsub_out_of_step", "pubsub: a shard reply that answers no command written")

func (l *shardLink) write(kind int8, channels []string, send func() error) error {
	c := &sentCmd{kind: kind}
	if len(channels) > 0 {
		c.left = make(map[string]struct{}, len(channels))
		for _, ch := range channels {
			c.left[ch] = struct{}{}
		}
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	l.sent = append(l.sent, c)
	l.mu.Unlock()
	return send()
}

func (l *shardLink) ping(ctx context.Context) error {
	return l.write(cmdPing, nil, func() error {
		return l.ps.Ping(ctx, strconv.FormatInt(time.Now().UnixNano(), 10))
	})
}

func (l *shardLink) subscribe(ctx context.Context, channels []string) error {
	return l.write(cmdSubscribe, channels, func() error { return l.ps.SSubscribe(ctx, channels...) })
}

func (l *shardLink) unsubscribe(ctx context.Context, channels []string) error {
	return l.write(cmdUnsubscribe, channels, func() error { return l.ps.SUnsubscribe(ctx, channels...) })
}

// popLocked drops the first command: it is answered.
func (l *shardLink) popLocked() *sentCmd {
	c := l.sent[0]
	l.sent[0] = nil
	l.sent = l.sent[1:]
	return c
}

// confirmation matches an SSUBSCRIBE or SUNSUBSCRIBE confirmation to the
// first command outstanding. push reports an SUNSUBSCRIBE that answers no
// command: the server ended the subscription on its own (its slot moved
// away). ok is false for a reply no command expects.
func (l *shardLink) confirmation(kind, channel string) (push, ok bool) {
	want := cmdSubscribe
	switch kind {
	case "ssubscribe":
	case "sunsubscribe":
		want = cmdUnsubscribe
	default:
		return false, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sent) == 0 || l.sent[0].kind != want {
		return want == cmdUnsubscribe, want == cmdUnsubscribe
	}
	head := l.sent[0]
	if _, mine := head.left[channel]; !mine {
		return want == cmdUnsubscribe, want == cmdUnsubscribe
	}
	delete(head.left, channel)
	if len(head.left) == 0 {
		l.popLocked()
	}
	return false, true
}

// pong matches a PONG to the first command outstanding, a PING.
func (l *shardLink) pong() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sent) == 0 || l.sent[0].kind != cmdPing {
		return false
	}
	l.popLocked()
	return true
}

// refused returns the command an error reply answers (the first one
// outstanding), or nil if none is.
func (l *shardLink) refused() *sentCmd {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sent) == 0 {
		return nil
	}
	return l.popLocked()
}

// refusedShard applies the server's refusal of one command written on sh
// and reports whether the connection can go on. A refused SSUBSCRIBE
// subscribed none of its channels: each that waits for no other
// SSUBSCRIBE and is not confirmed goes back to the router, subscribed
// again after a backoff (at once on the owner MOVED names, after reading
// the slot map). A refused SUNSUBSCRIBE ended none of its subscriptions:
// it is sent again after a backoff, unless MOVED says the node does not
// serve the slot (it then holds none of its channels: the server drops a
// slot's subscriptions when the slot leaves it). One of a channel that is
// no longer unsubscribing on sh cannot be sent again: the connection ends,
// and the server drops what it held on it.
func (s *Subscriber) refusedShard(sh *shard, cmd *sentCmd, cause error) bool {
	if cmd.kind == cmdPing {
		return true
	}
	moved := movedSlot(cause.Error()) >= 0
	s.logger.Warn("pubsub shard refused a command; retrying", slog.String("shard", sh.addr),
		slog.Bool("subscribe", cmd.kind == cmdSubscribe), slog.String("kind", rds.Kind(cause)))
	s.mu.Lock()
	ok := true
	for ch := range cmd.left {
		st := s.chans[ch]
		mine := st != nil && st.shard == sh
		switch {
		case cmd.kind == cmdSubscribe:
			if !mine {
				continue
			}
			if st.pendingSubs > 0 {
				st.pendingSubs--
			}
			if st.sent == sentSubscribe && st.pendingSubs == 0 && !st.confirmed {
				s.detachLocked(ch, st)
			}
		case moved:
			if mine && st.sent == sentUnsubscribe {
				s.unsubscribedLocked(ch, st)
			}
		case mine && st.sent == sentUnsubscribe:
			st.retry = true
			s.dirty[ch] = struct{}{}
		default:
			ok = false
		}
	}
	s.reload = true
	s.retryAt = time.Now().Add(s.nextBackoffLocked(!moved))
	s.mu.Unlock()
	s.wake()
	return ok
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

// shardFlushLoop sends the SSUBSCRIBE/SUNSUBSCRIBE commands the router
// queued on sh, one command per slot.
func (s *Subscriber) shardFlushLoop(ctx context.Context, sh *shard, link *shardLink) {
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
		err := s.sendBySlot(ctx, link, false, unsubs)
		if err == nil && len(subs) > 0 {
			err = s.sendBySlot(ctx, link, true, subs)
			if err == nil {
				err = link.ping(ctx)
			}
		}
		if err != nil {
			_ = link.ps.Close()
			return
		}
	}
}

func (s *Subscriber) sendBySlot(ctx context.Context, link *shardLink, sub bool, channels map[string]struct{}) error {
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
				err = link.subscribe(ctx, group[:n])
			} else {
				err = link.unsubscribe(ctx, group[:n])
			}
			if err != nil {
				return err
			}
			group = group[n:]
		}
	}
	return nil
}

// shardPingLoop PINGs the connection every canary interval. A PING that
// cannot be written ends the connection: go-redis would otherwise dial a
// new one behind the subscriber's back and subscribe it again to what it
// remembers, not to what the subscriber holds.
func (s *Subscriber) shardPingLoop(ctx context.Context, link *shardLink) {
	t := time.NewTicker(s.cfg.CanaryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := link.ping(ctx); err != nil {
			_ = link.ps.Close()
			return
		}
	}
}
