package store

import (
	"context"
	"errors"
	"sync"
)

// DefaultSendQueue is how many sends into one dialog an instance holds at
// once when HAN_SEND_DIALOG_QUEUE is not set.
const DefaultSendQueue = 256

// sendShare is how many of a dialog queue's sends one sender may hold at
// once, waiting and being written: one sender's burst cannot fill the
// queue and leave the dialog's other members dialog_busy. A member's
// client has a send or two in flight (a hot dialog of 100 members with two
// concurrent sends each stays well within it); a burst over it gets the
// answer of a full queue. Many senders who are no members cannot fill it
// either: see unverifiedShare.
const sendShare = 8

// sendCombiner is the instance-wide write combiner of message sends: one
// queue per dialog with sends in it, and at most one writer per queue.
// The writer takes the sends waiting in its queue (up to maxGroupSends, the
// oldest) and writes them in one transaction (write), in the order they
// arrived; the rest wait for the next batch, and sends that arrive
// meanwhile wait for the next one, unless the batch has not yet gone to
// PostgreSQL (it waits for company or for a send transaction: refill), in
// which case they join it. A lone send is a batch of one.
//
// A queue holds at most bound sends, waiting and being written, and at most
// share of them from one sender; one more is refused with ErrDialogBusy
// (the send never enters the queue, so the seqs of the sends it holds keep
// their arrival order). Membership is checked by the send statement, so
// the combiner tells members from outsiders by what it learned (known):
// the sends of senders it does not know to be members of the dialog hold
// together at most a small part of the queue (unverifiedShare), and one
// more is refused with errUnverified, after which the caller reads the
// sender's membership and queues the send as a member's or answers
// ErrDialogNotFound (Store.SendMessage). So outsiders, however many
// accounts they send from, hold at most that part, and a member is never
// refused for it. None of these checks costs a round trip; the membership
// read runs only for a send refused by one of them. A caller whose
// context ends while its send is waiting takes it out of the queue (nothing
// of it is written); once the send is being written, the caller waits for
// the outcome, which the send's own budget bounds (a batch that gives up on
// some of its sends puts them back at the head of the queue:
// queueRef.requeue).
type sendCombiner struct {
	// write writes a batch of the dialog queue q (see queueRef).
	write func(dialogID string, batch []*sendReq, q *queueRef)

	mu     sync.Mutex // guards bound, share, queues, every queue in it and known
	bound  int
	share  int // sendShare (tests change it)
	queues map[string]*dialogQueue
	known  knownMembers
}

type dialogQueue struct {
	waiting []*sendReq
	// flight is the batch being written: the sends it took from the
	// queue, refills in, requeued sends out. Its sends leave the queue
	// (its bound and their senders' shares) when the next batch is taken
	// or the queue goes idle.
	flight  []*sendReq
	writing bool           // the queue has its writer (drain)
	held    map[string]int // sends in waiting and flight by sender id
	// unverified is how many sends in waiting and flight were queued for
	// a sender not known to be a member (sendReq.unverified).
	unverified int
}

func newSendCombiner(write func(string, []*sendReq, *queueRef)) *sendCombiner {
	return &sendCombiner{write: write, bound: DefaultSendQueue, share: sendShare, queues: map[string]*dialogQueue{},
		known: knownMembers{}}
}

// SetSendQueue sets how many sends into one dialog this instance holds at
// once, waiting and being written (n ≥ 1; smaller values are ignored); a
// send over it, or over its sender's share of it (sendShare), fails with
// ErrDialogBusy. One transaction writes at most maxGroupSends of them; the
// rest wait for the next.
func (s *Store) SetSendQueue(n int) {
	if n >= 1 {
		s.sends.mu.Lock()
		s.sends.bound = n
		s.sends.mu.Unlock()
	}
}

// errUnverified refuses a send of a sender not known to be a member of the
// dialog when such senders' sends already hold their part of its queue
// (unverifiedShare); the caller reads the membership (Store.SendMessage).
var errUnverified = errors.New("store: sender not known to be a member")

// send queues r and waits until it is answered (r.res), or returns
// ErrDialogBusy, errUnverified or the context's error without having
// written anything. r.member says the sender was just read to be a member.
func (c *sendCombiner) send(ctx context.Context, r *sendReq) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	id, sender := r.in.DialogID, r.in.SenderID
	key, keyOK := memberKey(id, sender)
	c.mu.Lock()
	q := c.queues[id]
	if q == nil {
		q = &dialogQueue{held: map[string]int{}}
		c.queues[id] = q
	}
	if len(q.waiting)+len(q.flight) >= c.bound || q.held[sender] >= c.share {
		c.mu.Unlock()
		return ErrDialogBusy
	}
	r.unverified = !r.member && !c.known.has(key, keyOK)
	if r.unverified {
		if q.unverified >= max(c.bound/unverifiedShare, 1) {
			c.mu.Unlock()
			return errUnverified
		}
		q.unverified++
	}
	q.waiting = append(q.waiting, r)
	q.held[sender]++
	// The queue has a writer while it has a batch in flight or sends
	// waiting. The first send into an idle queue is its writer: it writes
	// the batch it heads at once, on its own goroutine (a lone send costs
	// no hand-off), and leaves whatever arrived meanwhile to a drain.
	if !q.writing {
		q.writing = true
		batch := c.take(q)
		c.mu.Unlock()
		c.write(id, batch, &queueRef{c, q})
		if c.next(id, q) {
			go c.drain(id, q)
		}
		<-r.done
		return nil
	}
	c.mu.Unlock()

	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !r.taken {
		for i, w := range q.waiting {
			if w == r {
				q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
				q.release(r)
				break
			}
		}
		c.mu.Unlock()
		return ctx.Err()
	}
	c.mu.Unlock()
	<-r.done
	return nil
}

// drain is the queue's writer after its first batch: it writes batches
// until no send waits.
func (c *sendCombiner) drain(id string, q *dialogQueue) {
	for {
		c.mu.Lock()
		batch := c.take(q)
		c.mu.Unlock()
		c.write(id, batch, &queueRef{c, q})
		if !c.next(id, q) {
			return
		}
	}
}

// take removes the waiting sends of q as the next batch, oldest first, at
// most maxGroupSends (the rest wait for the batch after it); the batch
// written before it leaves the queue. c.mu is held.
func (c *sendCombiner) take(q *dialogQueue) []*sendReq {
	q.release(q.flight...)
	q.flight = q.takeWaiting(maxGroupSends)
	return q.flight
}

// release gives back the slots of rs, which left q, to their senders'
// shares; the combiner's mutex is held.
func (q *dialogQueue) release(rs ...*sendReq) {
	for _, r := range rs {
		if r.unverified {
			q.unverified--
		}
		if n := q.held[r.in.SenderID] - 1; n > 0 {
			q.held[r.in.SenderID] = n
		} else {
			delete(q.held, r.in.SenderID)
		}
	}
}

// queueRef is the dialog queue of the batch being written.
type queueRef struct {
	c *sendCombiner
	q *dialogQueue
}

// refill takes up to n of the sends waiting in the queue, oldest first,
// into the batch being written, while that batch has not yet gone to
// PostgreSQL (it waited for a send transaction, or for company): they go in
// the same statement, after the batch's own sends, in the order they
// arrived. The queue's bound and their senders' shares count them as
// before (waiting, then being written).
func (r *queueRef) refill(n int) []*sendReq {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	more := r.q.takeWaiting(n)
	r.q.flight = append(r.q.flight, more...)
	return more
}

// requeue puts sends of the batch being written back at the head of the
// queue, unwritten and in their order, for the dialog's next batch to take
// first (seqs stay in arrival order): the batch gave up on them and ends
// without them, so that the sends it did answer, its writer's among them,
// are not held until they are written. The bound and their senders' shares
// count them as waiting.
func (r *queueRef) requeue(rs []*sendReq) {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	for _, s := range rs {
		s.taken = false
	}
	r.q.waiting = append(rs[:len(rs):len(rs)], r.q.waiting...)
	flight := make([]*sendReq, 0, len(r.q.flight)-len(rs))
	for _, s := range r.q.flight {
		if s.taken {
			flight = append(flight, s)
		}
	}
	r.q.flight = flight
}

// takeWaiting removes up to n of q's waiting sends, oldest first, and marks
// them taken; the combiner's mutex is held.
func (q *dialogQueue) takeWaiting(n int) []*sendReq {
	n = min(n, len(q.waiting))
	taken := q.waiting[:n:n]
	if n == len(q.waiting) {
		q.waiting = nil
	} else {
		q.waiting = q.waiting[n:]
	}
	for _, r := range taken {
		r.taken = true
	}
	return taken
}

// next reports whether sends wait in q after a batch was written; when
// none does, the queue is idle and removed.
func (c *sendCombiner) next(id string, q *dialogQueue) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(q.waiting) > 0 {
		return true
	}
	q.release(q.flight...)
	q.flight, q.writing = nil, false
	delete(c.queues, id)
	return false
}
