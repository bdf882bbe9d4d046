package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/combine"
	"github.com/han-app/gateway/internal/ids"
)

// Subscribe checks batching. Every realtime subscribe reads its dialog's
// last seq for its user (DialogLastSeq: membership and the seq in one
// read). Checks that arrive together share one statement: while a query is
// in flight the next checks queue, and when it ends they go out together
// as one query over arrays of (dialog, user) pairs. A lone check goes out
// at once (or after the realtime linger, SetRealtimeLinger); a reconnect
// storm of thousands of sockets resubscribing costs one query per batch
// instead of one per subscribe, and never more than lastSeqInFlight pool
// connections.
const (
	// lastSeqInFlight is how many batch queries run at once. One: checks
	// that arrive while a query runs wait for it and go out together, so
	// batches are larger and queries fewer. With two, a connect of 10,000
	// clients cost PostgreSQL ≈ 0.084 ms of CPU per connection against
	// ≈ 0.050 with one (docs/benchmarks.md, "Connect rate with CPU per
	// connection"): a query's fixed cost outweighs its per-pair cost.
	lastSeqInFlight = 1
	// lastSeqBatchMax bounds the pairs of one query.
	lastSeqBatchMax = 512
	// lastSeqSharedBudget bounds a query shared by several callers.
	lastSeqSharedBudget = 5 * time.Second
)

// lastSeqSQL answers, for each pair of the two arrays (same index), the
// dialog's last_seq when the user is a member; pairs of non-members (or of
// no dialog) have no row. i is the pair's 1-based position.
const lastSeqSQL = `SELECT r.i, d.last_seq
	FROM unnest($1::text[]::uuid[], $2::text[]::uuid[]) WITH ORDINALITY AS r(dialog_id, user_id, i)
	JOIN dialog_members m ON m.dialog_id = r.dialog_id AND m.user_id = r.user_id
	JOIN dialogs d ON d.id = r.dialog_id`

// lastSeqCall is one check waiting in a batch.
type lastSeqCall struct {
	sharedCall
	dialogID, userID string
	seq              int64
	found            bool
}

func newLastSeqBatcher(s *Store) *stmtBatcher[*lastSeqCall] {
	return newStmtBatcher(lastSeqInFlight, lastSeqBatchMax, lastSeqSharedBudget, "dialog last seq",
		func(ctx context.Context, live []*lastSeqCall) error {
			dialogs, users := make([]string, len(live)), make([]string, len(live))
			for i, c := range live {
				dialogs[i], users[i] = c.dialogID, c.userID
			}
			err := s.queryLastSeqs(ctx, dialogs, users, func(i int, seq int64) {
				if i >= 1 && i <= len(live) {
					live[i-1].seq, live[i-1].found = seq, true
				}
			})
			if err != nil { // no answer from a query that failed part way
				for _, c := range live {
					c.seq, c.found = 0, false
				}
			}
			return err
		})
}

// SubscribeCheckStats counts the calls of a batched read or write and the
// statements that answered them (fewer than the calls when calls were
// batched).
type SubscribeCheckStats struct {
	Checks, Queries uint64
}

// SubscribeCheckStats returns the counters of this Store's DialogLastSeq
// checks.
func (s *Store) SubscribeCheckStats() SubscribeCheckStats { return s.lastSeqs.stats() }

// checkLastSeq answers one pair, batched with the checks of other callers.
func (s *Store) checkLastSeq(ctx context.Context, dialogID, userID string) (int64, bool, error) {
	if err := s.lastSeqs.begin(ctx); err != nil {
		return 0, false, err
	}
	// Neither id can name a row unless it is a UUID; keeping other text out
	// of the arrays keeps one caller's bad input from failing the batch.
	if !ids.Valid(dialogID) || !ids.Valid(userID) {
		return 0, false, nil
	}
	c := &lastSeqCall{sharedCall: sharedCall{ctx: ctx}, dialogID: dialogID, userID: userID}
	err := s.lastSeqs.do(c)
	return c.seq, c.found, err
}

// sharedCall is what a batch needs of each of its calls: the caller's
// context and a place for the call's error. Call types embed it.
type sharedCall struct {
	ctx context.Context
	err error
}

func (c *sharedCall) shared() *sharedCall { return c }

// batchedCall is a call type of a stmtBatcher: a pointer to a struct that
// embeds sharedCall.
type batchedCall interface{ shared() *sharedCall }

// stmtBatcher answers the calls of concurrent callers with shared
// statements (the subscribe checks here, the presence transitions' dialog
// reads, the first-sight user records): a lone call goes out at once (or
// after the realtime linger); while inFlight statements run the next calls
// queue, and when one ends they go out together, at most max of them. It
// counts the calls made and the statements that answered them. Safe for
// concurrent use.
type stmtBatcher[C batchedCall] struct {
	comb           combine.Combiner[C]
	calls, queries atomic.Uint64
}

// newStmtBatcher returns a batcher whose statement is query, run for the
// calls of a batch whose context is still live under a context that no
// single caller's leaving cuts short (at most budget long); when it fails,
// every live call gets its error, named by what.
func newStmtBatcher[C batchedCall](inFlight, max int, budget time.Duration, what string,
	query func(ctx context.Context, live []C) error) *stmtBatcher[C] {
	b := &stmtBatcher[C]{}
	b.comb = combine.Combiner[C]{InFlight: inFlight, Max: max, Exec: func(batch []C) {
		b.queries.Add(1)
		sharedQuery(batch, budget, what, query)
	}}
	return b
}

// begin counts one call, unless its context has already ended.
func (b *stmtBatcher[C]) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.calls.Add(1)
	return nil
}

// do runs c in a shared statement and returns its error. A call still
// queued when its context ends leaves unexecuted with the context's error
// (as a batch answers a call whose context ended before it ran), so a
// stalled statement holds only the calls it carries, not the callers
// queued behind it past their deadlines; a call in a running statement
// waits for it, which the statement's shared context bounds.
func (b *stmtBatcher[C]) do(c C) error {
	sc := c.shared()
	if err := b.comb.DoCtx(sc.ctx, c); err != nil {
		return err
	}
	return sc.err
}

// SetRealtimeLinger sets how long a subscribe check, a presence
// transition's dialog read, a first-sight user record or a last-seen record
// that finds its statement free waits for others to share it (0: sent at
// once). Call it
// before the Store is used.
func (s *Store) SetRealtimeLinger(d time.Duration) {
	d = max(d, 0)
	s.lastSeqs.comb.Linger = d
	s.userDialogs.comb.Linger = d
	s.ensureUsers.comb.Linger = d
	s.lastSeen.comb.Linger = d
}

// stats reads the counters.
func (b *stmtBatcher[C]) stats() SubscribeCheckStats {
	return SubscribeCheckStats{Checks: b.calls.Load(), Queries: b.queries.Load()}
}

// sharedQuery runs one query for the calls of batch whose context is still
// live (the others get their context's error), under a context that no
// single caller's leaving cuts short; when it fails, every live call gets
// the error, named by what.
func sharedQuery[C batchedCall](batch []C, budget time.Duration, what string, query func(ctx context.Context, live []C) error) {
	live := make([]C, 0, len(batch))
	for _, c := range batch {
		sc := c.shared()
		if sc.err = sc.ctx.Err(); sc.err == nil {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := combine.SharedContext(live, func(c C) context.Context { return c.shared().ctx }, budget)
	defer cancel()
	if err := query(ctx, live); err != nil {
		for _, c := range live {
			c.shared().err = fmt.Errorf("%s: %w", what, err)
		}
	}
}

// queryLastSeqs runs lastSeqSQL and calls row for each answered pair.
func (s *Store) queryLastSeqs(ctx context.Context, dialogs, users []string, row func(i int, seq int64)) error {
	rows, err := s.pool.Query(ctx, lastSeqSQL, dialogs, users)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			i   int64
			seq int64
		)
		if err := rows.Scan(&i, &seq); err != nil {
			return err
		}
		row(int(i), seq)
	}
	return rows.Err()
}
