package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// RecoveryKept is the bytes of message.created frames the dialog's
// recovery read keeps for the subscribes that join it while it lingers;
// false when no read of the dialog has ended and still serves joiners.
func (s *Service) RecoveryKept(dialogID string) (bytes int, ok bool) {
	r := s.hub.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	df := r.dialogs[pubsub.DialogChannel(dialogID)]
	if df == nil || df.cur == nil || !df.cur.ended {
		return 0, false
	}
	for _, e := range df.cur.res.Events {
		bytes += len(e.Frame)
	}
	return bytes, true
}

// PendingHeld is what the subscriptions to dialogID not yet answered with
// subscribed hold for their connections: frames and their bytes, and
// whether any of them gave up holding (its connection gets a resync).
func (s *Service) PendingHeld(dialogID string) (frames, bytes int, overflowed bool) {
	h := s.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	m := h.channels[pubsub.DialogChannel(dialogID)]
	if m == nil {
		return 0, 0, false
	}
	for _, e := range m.list {
		e.c.mu.Lock()
		if e.s != nil && !e.s.ready {
			frames += len(e.s.pending)
			for _, f := range e.s.pending {
				bytes += len(f.b)
			}
			overflowed = overflowed || e.s.pendingOverflow
		}
		e.c.mu.Unlock()
	}
	return frames, bytes, overflowed
}

// RecoveryBuffered is the bytes of message.created frames kept beside the
// dialog's current recovery read (dispatched since it began), and whether
// it let go of them for overflowing; ok false when the dialog has no
// current read.
func (s *Service) RecoveryBuffered(dialogID string) (bytes int, full, ok bool) {
	r := s.hub.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	df := r.dialogs[pubsub.DialogChannel(dialogID)]
	if df == nil || df.cur == nil {
		return 0, false, false
	}
	for _, e := range df.cur.buf {
		bytes += len(e.b)
	}
	return bytes, df.cur.bufFull, true
}

// HoldRecoveryReads makes each recovery read of the instance, once it has
// read PostgreSQL, wait until release is called before its subscribers
// are answered; read receives a value as each read has been made. Call it
// before the reads it holds begin.
func (s *Service) HoldRecoveryReads() (read <-chan struct{}, release func()) {
	r := s.hub.rec
	h := &heldReader{read: make(chan struct{}, 16), release: make(chan struct{})}
	r.mu.Lock() // join, which precedes every read, takes it
	h.next, r.read = r.read, h
	r.mu.Unlock()
	return h.read, sync.OnceFunc(func() { close(h.release) })
}

type heldReader struct {
	next    recoveryReader
	read    chan struct{}
	release chan struct{}
}

func (h *heldReader) RecoverDialog(ctx context.Context, dialogID string, afterSeq int64, window time.Duration, limit, maxBytes int) (store.DialogRecovery, error) {
	res, err := h.next.RecoverDialog(ctx, dialogID, afterSeq, window, limit, maxBytes)
	h.read <- struct{}{}
	<-h.release
	return res, err
}

// ConnHeld is what userID's connections hold for their clients: the
// bytes of their outbound queues together with those their writers have
// taken and not yet written, the durable events still queued, and the
// bytes of the live events their subscriptions not yet answered with
// subscribed hold.
func (s *Service) ConnHeld(userID string) (queued, durable, pending int) {
	h := s.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	for c := range h.conns {
		if c.userID != userID {
			continue
		}
		c.mu.Lock()
		queued += c.qBytes
		for _, f := range c.q {
			if f.class == classDurable {
				durable++
			}
		}
		for _, sb := range c.subs {
			for _, f := range sb.pending {
				pending += len(f.b)
			}
		}
		c.mu.Unlock()
	}
	return queued, durable, pending
}
