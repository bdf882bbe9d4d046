package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// SendQueueDepth is how many sends into the dialog this instance holds,
// waiting and being written (tests order sends through it).
func (s *Store) SendQueueDepth(dialogID string) int {
	c := s.sends
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[dialogID]
	if q == nil {
		return 0
	}
	return len(q.waiting) + len(q.flight)
}

// SetSendShare sets how many of a dialog queue's sends one sender may hold
// (sendShare), for tests that fill a queue from a few senders.
func (s *Store) SetSendShare(n int) {
	s.sends.mu.Lock()
	s.sends.share = n
	s.sends.mu.Unlock()
}

// SendShare is how many of a dialog queue's sends one sender may hold.
const SendShare = sendShare

// SendGroupWaiting is how many dialogs' batches wait for a free send
// transaction.
func (s *Store) SendGroupWaiting() int {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	return len(s.groups.waiting)
}

// HoldCommitterOnLocks lets a send transaction wait for a dialog's lock up
// to a quarter of its budget (instead of maxCommitterLockWait), so a test
// can keep the committers busy with a held lock.
func (s *Store) HoldCommitterOnLocks() { s.groups.lockWait = time.Hour }

// RequestTx runs fn as a request transaction (requestTx).
func (s *Store) RequestTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.requestTx(ctx, fn)
}

// MaxGroupSends is the most sends one send transaction writes.
const MaxGroupSends = maxGroupSends

// KnownSenders is how many (dialog, member) pairs the send combiner
// remembers.
func (s *Store) KnownSenders() int {
	s.sends.mu.Lock()
	defer s.sends.mu.Unlock()
	return len(s.sends.known)
}
