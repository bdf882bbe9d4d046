package store

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/combine"
)

// DefaultSendCommitters is how many send transactions an instance runs at
// once when HAN_SEND_COMMITTERS is not set. One gives the largest groups
// and the least PostgreSQL CPU per send (docs/benchmarks.md); the lock
// wait bound below keeps a dialog locked elsewhere from stalling it.
const DefaultSendCommitters = 1

// maxCommitterLockWait bounds how long a send transaction waits for one
// dialog's row lock (at most a quarter of its budget): a dialog locked
// elsewhere for longer leaves the committer, and its batch is written again
// on its own, outside it, each send within the rest of its budget
// (writeAlone).
const maxCommitterLockWait = 100 * time.Millisecond

// maxGroupDialogs bounds how many dialogs' batches one group transaction
// carries.
const maxGroupDialogs = 32

// maxGroupSends bounds how many sends one send transaction (one send_groups
// statement) writes, whatever the dialogs: a dialog's batch takes at most
// that many of its queue, and a group takes waiting batches, in arrival
// order, only while their sends fit. The sends left behind are written by
// the next transaction, which the committer starts at once. send_groups'
// time grows with the sends it writes (about 50 ms for 512 on the
// benchmark machine; 8,192, which 32 full dialog queues once made one
// statement, took seconds, past the 2 s budget: docs/benchmarks.md,
// "send_groups: cost per message"). Bounded, a statement stays far within
// the budget of the sends it carries, and sends
// that a backlog keeps from being written within their budget are answered
// database_busy unwritten while they wait, instead of failing together when
// one huge statement outlives them.
const maxGroupSends = 512

// commitGroups is the second stage of the send path, after the per-dialog
// combiner: the batches of different dialogs that are ready at the same
// time are written in one transaction (a group commit). At most max groups
// are in flight; a batch that finds them all busy waits, and the next free
// committer takes the waiting batches as its group (as many as fit in one:
// maxGroupDialogs, maxGroupSends). A batch that finds a
// committer free waits up to linger (HAN_SEND_LINGER) for company: the
// batches that arrive meanwhile join its group (0: it is written at once,
// alone).
//
// A group is one statement (send_groups, which takes the dialogs' row
// locks in dialog-id order, so two groups that share dialogs take them in
// the same order, and runs each step of the write once for all of them)
// and one commit: PostgreSQL pays one statement, one commit, one WAL flush
// and one client round trip for the whole group, and the number of
// concurrent send transactions stays at max however many sends
// arrive, so the sends do not contend with each other for PostgreSQL's
// locks and CPU. When the group's transaction fails, nothing of it was
// committed, and every batch of it is written again on its own, so one
// dialog's failure (a lock wait over budget, a value PostgreSQL refuses)
// stays with that dialog. A committer waits for a dialog's row lock at most
// maxCommitterLockWait (and a quarter of the budget): a batch whose dialog
// is locked elsewhere for longer, like every batch of a failed group, is
// written again on its own goroutine, outside the committers, each send
// within the rest of its own budget (writeAlone), so a held lock delays only
// its own dialog. Every send statement is bounded on the server by the
// earliest budget of the sends it writes (runSendGroup).
type commitGroups struct {
	exec func(group []*dialogBatch)

	// lockWait is maxCommitterLockWait (tests lengthen it to keep a
	// committer busy).
	lockWait time.Duration

	mu      sync.Mutex
	max     int
	active  int
	waiting []*dialogBatch
	// linger is how long a batch that finds a committer free waits for
	// the batches of other dialogs to join its transaction (0: none).
	linger time.Duration
	// company is a committer waiting for linger; the waiting batches end
	// its wait early when they fill a group.
	company combine.Company

	// Counters: transactions written (groups, and batches written again
	// alone) and the sends and dialog batches they carried.
	txs, batches, sends atomic.Uint64
}

// dialogBatch is one dialog's combined sends on their way through a group.
type dialogBatch struct {
	dialogID string
	reqs     []*sendReq
	deadline time.Time // the earliest of the sends' budgets
	rows     []sendRow
	err      error
	done     chan struct{} // closed once rows or err is set (settle)
	// queue is the dialog's queue, which sends that queued behind the
	// batch join it from and sends it gives up on return to (nil: none
	// joins, as for a send written again alone).
	queue *queueRef
}

// topUp adds to b up to room sends of its dialog that queued while it
// waited (for a send transaction or for company), oldest first, and returns
// how many it took from the queue; one whose budget ran out meanwhile is
// answered unwritten.
func (b *dialogBatch) topUp(room int) int {
	if b.queue == nil || room <= 0 {
		return 0
	}
	more := b.queue.refill(room)
	now := time.Now()
	for _, r := range more {
		if !now.Before(r.deadline) {
			r.finish(sendResult{err: errQueuedPastBudget()})
			continue
		}
		if r.deadline.Before(b.deadline) {
			b.deadline = r.deadline
		}
		b.reqs = append(b.reqs, r)
	}
	return len(more)
}

// prune answers the sends of b whose budget ran out (ErrDatabaseBusy,
// unwritten) and takes them out of it, so the batch is written with the
// budget of the sends left: each send's budget is its own, and one that ran
// out must neither fail the others nor be answered twice (its writer
// answers every send still in b.reqs). It reports whether any send is left.
func (b *dialogBatch) prune(now time.Time) bool {
	if now.Before(b.deadline) {
		return true // b.deadline is the earliest: none ran out
	}
	return b.drop(func(r *sendReq) bool { return !now.Before(r.deadline) }, errQueuedPastBudget())
}

// drop answers err to the sends of b that gone picks and takes them out of
// it; b.deadline becomes the earliest budget of the sends left. It reports
// whether any send is left.
func (b *dialogBatch) drop(gone func(*sendReq) bool, err error) bool {
	kept := b.reqs[:0]
	var deadline time.Time
	for _, r := range b.reqs {
		if gone(r) {
			r.finish(sendResult{err: err})
			continue
		}
		if deadline.IsZero() || r.deadline.Before(deadline) {
			deadline = r.deadline
		}
		kept = append(kept, r)
	}
	clear(b.reqs[len(kept):])
	b.reqs, b.deadline = kept, deadline
	return len(kept) > 0
}

// settle records the batch's outcome and wakes its writer.
func (b *dialogBatch) settle(rows []sendRow, err error) {
	b.rows, b.err = rows, err
	close(b.done)
}

func newCommitGroups(exec func([]*dialogBatch)) *commitGroups {
	return &commitGroups{exec: exec, max: DefaultSendCommitters, lockWait: maxCommitterLockWait, linger: DefaultSendLinger}
}

// DefaultSendLinger is how long a send batch that finds a committer free
// waits for other dialogs' batches to share its transaction when
// HAN_SEND_LINGER is not set (docs/benchmarks.md: at moderate rates most
// transactions would otherwise carry one send).
const DefaultSendLinger = 5 * time.Millisecond

// SetSendLinger sets how long a send batch that finds a committer free
// waits for company (0: written at once). Sends wait at most that much
// longer; under load, when batches queue for the committers anyway, it
// changes nothing.
func (s *Store) SetSendLinger(d time.Duration) {
	s.groups.mu.Lock()
	s.groups.linger = max(d, 0)
	s.groups.mu.Unlock()
}

// SendStats counts what the send path wrote: transactions, the dialog
// batches and the sends they carried.
type SendStats struct {
	Transactions, Batches, Sends uint64
}

// SendStats returns this Store's send counters.
func (s *Store) SendStats() SendStats {
	return SendStats{Transactions: s.groups.txs.Load(), Batches: s.groups.batches.Load(), Sends: s.groups.sends.Load()}
}

// count records one transaction written with the given batches.
func (g *commitGroups) count(batches ...*dialogBatch) {
	g.txs.Add(1)
	g.batches.Add(uint64(len(batches)))
	n := 0
	for _, b := range batches {
		n += len(b.reqs)
	}
	g.sends.Add(uint64(n))
}

// SetSendCommitters sets how many send transactions this instance runs at
// once (n ≥ 1; smaller values are ignored). Sends beyond them wait and are
// written together in the next free transaction.
func (s *Store) SetSendCommitters(n int) {
	if n >= 1 {
		s.groups.mu.Lock()
		s.groups.max = n
		s.groups.mu.Unlock()
	}
}

// commit writes b, alone or in a group, and returns once b.rows or b.err is
// set.
func (g *commitGroups) commit(b *dialogBatch) {
	b.done = make(chan struct{})
	g.mu.Lock()
	if g.active >= g.max || g.company.Waiting() {
		g.waiting = append(g.waiting, b)
		g.company.Joined(len(g.waiting))
		g.mu.Unlock()
		<-b.done
		return
	}
	g.active++
	group := []*dialogBatch{b}
	if g.linger > 0 {
		group = g.gatherLocked(b)
	}
	g.mu.Unlock()
	// Written on the caller's goroutine; what waited meanwhile is left to
	// a drain, so this caller is answered as soon as its own group is.
	g.exec(group)
	if group := g.next(); group != nil {
		go g.drain(group)
	}
	<-b.done
}

// gatherLocked (g.mu held) holds the committer's slot for up to linger
// (less when the waiting batches fill a group first) and returns b with the
// batches that arrived meanwhile as one group. At a moderate rate most
// transactions would carry one dialog's batch; the wait lets PostgreSQL pay
// one commit, one WAL flush and one round trip for several. The wait is at
// most lingerShare of what is left of b's budget (none once it ran out):
// the rest is the statement's, so a linger near the request budget delays
// a lone send instead of failing it.
func (g *commitGroups) gatherLocked(b *dialogBatch) []*dialogBatch {
	if wait := min(g.linger, time.Until(b.deadline)/lingerShare); wait > 0 {
		g.company.Wait(&g.mu, wait, maxGroupDialogs-1)
	}
	return g.takeLocked([]*dialogBatch{b})
}

// lingerShare: a batch waits for company at most 1/lingerShare of what is
// left of its budget.
const lingerShare = 4

// takeLocked (g.mu held) moves the waiting batches that fit in group into
// it, in arrival order: at most maxGroupDialogs batches and maxGroupSends
// sends in all, and at least one batch. The first batch that does not fit
// heads the next group.
func (g *commitGroups) takeLocked(group []*dialogBatch) []*dialogBatch {
	sends := 0
	for _, b := range group {
		sends += len(b.reqs)
	}
	n := 0
	for ; n < len(g.waiting) && len(group) < maxGroupDialogs; n++ {
		b := g.waiting[n]
		if len(group) > 0 && sends+len(b.reqs) > maxGroupSends {
			break
		}
		group = append(group, b)
		sends += len(b.reqs)
	}
	g.waiting = append(g.waiting[:0], g.waiting[n:]...)
	return group
}

// drain writes waiting groups until none waits.
func (g *commitGroups) drain(group []*dialogBatch) {
	for group != nil {
		g.exec(group)
		group = g.next()
	}
}

// next takes the waiting batches as the next group (those that fit in one,
// in arrival order: takeLocked), or gives up the committer's slot and
// returns nil when none waits.
func (g *commitGroups) next() []*dialogBatch {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 {
		g.active--
		return nil
	}
	return g.takeLocked(nil)
}

// execGroup writes a group in one send_groups statement. A batch that could
// not be written because of its dialog (a lock held elsewhere, or anything
// PostgreSQL refused in a group) is written again on its own goroutine,
// outside the committers.
//
// Budgets are per send. One whose budget ran out while it waited (for a
// send transaction, for company or for a pool connection) is answered
// ErrDatabaseBusy unwritten and leaves its batch, and a batch left without
// sends leaves the group: neither fails nor shortens the others. So the
// pool wait is bounded by the latest budget in the group (bounded by the
// earliest, it would fail every dialog of the group when that one ran
// out), the sends that expired during it are answered once the connection
// is in hand, and the lock wait is derived from the earliest budget of the
// sends written.
func (s *Store) execGroup(group []*dialogBatch) {
	// The sends that queued behind each batch while it waited go with it,
	// as many as the group has room for (maxGroupSends); the rest wait for
	// the dialog's next batch.
	room := maxGroupSends
	for _, b := range group {
		room -= len(b.reqs)
	}
	for _, b := range group {
		room -= b.topUp(room)
	}
	if group = liveBatches(group); len(group) == 0 {
		return
	}
	latest := group[0].deadline
	for _, b := range group[1:] {
		if b.deadline.After(latest) {
			latest = b.deadline
		}
	}
	ctx, conn, done, err := s.sendConn(time.Until(latest))
	if err != nil {
		// Past the latest budget, or no connection at all: nothing of the
		// group can be written any more.
		for _, b := range group {
			b.settle(nil, err)
		}
		return
	}
	group = liveBatches(group)
	if len(group) == 0 {
		done()
		return
	}
	deadline := group[0].deadline
	for _, b := range group[1:] {
		if b.deadline.Before(deadline) {
			deadline = b.deadline
		}
	}
	budget := time.Until(deadline)
	s.groups.count(group...)
	out, err := s.runSendGroup(ctx, conn, budget, min(budget/4, s.groups.lockWait), group)
	done()
	if err == nil {
		for i, b := range group {
			b.settle(out[i], nil)
		}
		return
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (len(group) == 1 && !IsDatabaseBusy(err)) {
		// A failed connection, or a lone batch's own error: nothing to
		// gain from writing it again.
		for _, b := range group {
			b.settle(nil, err)
		}
		return
	}
	for _, b := range group {
		go s.writeAlone(b)
	}
}

// writeAlone writes b again on its own, outside the committers, after its
// group's statement failed (nothing of it was committed). Each send keeps
// its own budget: the write is bounded (pool wait, lock waits, statement)
// by what is left of the earliest budget among the sends in b, and when the
// database stays busy that long (no connection came free, the dialog's lock
// was not granted, the statement was cut short: nothing written), only the
// sends whose budget that was are answered database_busy. The others go
// back to the head of their dialog's queue and are written by its next
// batch, with what is left of their own budgets (a send written again alone
// after a refused value has no queue, and its batch no other send).
// Written with the earliest budget of the batch instead, a lock held a
// little longer than the shortest budget failed every send of the batch.
func (s *Store) writeAlone(b *dialogBatch) {
	for b.prune(time.Now()) {
		s.groups.count(b)
		out, err := s.execSendGroup(b.deadline, []*dialogBatch{b})
		if err == nil {
			b.settle(out[0], nil)
			return
		}
		earliest := b.deadline
		if !IsDatabaseBusy(err) || !b.drop(func(r *sendReq) bool { return !r.deadline.After(earliest) }, err) {
			b.settle(nil, err)
			return
		}
		if b.queue != nil {
			b.queue.requeue(b.reqs)
			b.reqs = nil
			b.settle(nil, nil)
			return
		}
	}
	b.settle(nil, errQueuedPastBudget())
}

// liveBatches prunes each batch of group (see prune) and returns, in
// place, the batches that still hold a send; a batch left without one is
// settled unwritten (its sends were answered by prune).
func liveBatches(group []*dialogBatch) []*dialogBatch {
	now := time.Now()
	live := group[:0]
	for _, b := range group {
		if b.prune(now) {
			live = append(live, b)
		} else {
			b.settle(nil, errQueuedPastBudget())
		}
	}
	return live
}

// execSendGroup writes the batches of group in one statement (runSendGroup)
// within the budget that ends at deadline: the pool wait, each lock wait
// and the statement are bounded by what is left of it.
func (s *Store) execSendGroup(deadline time.Time, group []*dialogBatch) ([][]sendRow, error) {
	ctx, conn, done, err := s.sendConn(time.Until(deadline))
	if err != nil {
		return nil, err
	}
	defer done()
	budget := time.Until(deadline)
	return s.runSendGroup(ctx, conn, budget, budget, group)
}

// setStatementTimeoutSQL bounds the statement after it, for its transaction
// only.
const setStatementTimeoutSQL = "SELECT set_config('statement_timeout', $1, true)"

// runSendGroup runs send_groups for group on conn in one implicit
// transaction: one round trip, one commit. The server bounds it by budget
// (statement_timeout, sent ahead of the statement in the same round trip
// and transaction) and each lock wait by lockWait (lock_timeout, set by the
// function; at most budget), both for this transaction only and at least
// 1 ms, so neither a lock nor a slow statement holds the connection and the
// dialogs' row locks past the budget: cut short, the statement answers
// ErrDatabaseBusy with nothing committed. The client (ctx) gives it one
// request budget more before it gives up on the connection, for a server
// that stalls. The rows are returned only when the commit succeeded; on an
// error nothing was committed, but for a statement whose answer did not
// come in time (sendError).
func (s *Store) runSendGroup(ctx context.Context, conn *pgxpool.Conn, budget, lockWait time.Duration, group []*dialogBatch) ([][]sendRow, error) {
	budget = max(budget, time.Millisecond)
	lockWait = min(max(lockWait, time.Millisecond), budget)
	batch := &pgx.Batch{}
	batch.Queue(setStatementTimeoutSQL, strconv.FormatInt(budget.Milliseconds(), 10))
	batch.Queue(sendGroupsSQL, sendArgs(lockWait, group)...)
	br := conn.SendBatch(ctx, batch)
	_, err := br.Exec()
	var out [][]sendRow
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			out, err = scanSendRows(rows, group)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, sendError(err)
	}
	return out, nil
}
