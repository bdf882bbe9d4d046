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
// at once (no added wait); a reconnect storm of thousands of sockets
// resubscribing costs one query per batch instead of one per subscribe, and
// never more than lastSeqInFlight pool connections.
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
	ctx              context.Context
	dialogID, userID string
	seq              int64
	found            bool
	err              error
}

// lastSeqBatcher sends concurrent DialogLastSeq checks as shared queries.
// Safe for concurrent use.
type lastSeqBatcher struct {
	s    *Store
	comb combine.Combiner[*lastSeqCall]

	calls, queries atomic.Uint64
}

func newLastSeqBatcher(s *Store) *lastSeqBatcher {
	b := &lastSeqBatcher{s: s}
	b.comb = combine.Combiner[*lastSeqCall]{Exec: b.exec, InFlight: lastSeqInFlight, Max: lastSeqBatchMax}
	return b
}

// SubscribeCheckStats counts DialogLastSeq checks and the queries that
// answered them (fewer than the checks when checks were batched).
type SubscribeCheckStats struct {
	Checks, Queries uint64
}

// SubscribeCheckStats returns the counters of this Store's DialogLastSeq
// checks.
func (s *Store) SubscribeCheckStats() SubscribeCheckStats {
	return SubscribeCheckStats{Checks: s.lastSeqs.calls.Load(), Queries: s.lastSeqs.queries.Load()}
}

// check answers one pair, batched with the checks of other callers.
func (b *lastSeqBatcher) check(ctx context.Context, dialogID, userID string) (int64, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	b.calls.Add(1)
	// Neither id can name a row unless it is a UUID; keeping other text out
	// of the arrays keeps one caller's bad input from failing the batch.
	if !ids.Valid(dialogID) || !ids.Valid(userID) {
		return 0, false, nil
	}
	c := &lastSeqCall{ctx: ctx, dialogID: dialogID, userID: userID}
	b.comb.Do(c)
	return c.seq, c.found, c.err
}

// exec answers the calls whose context is still live with one query.
func (b *lastSeqBatcher) exec(batch []*lastSeqCall) {
	b.queries.Add(1)
	sharedQuery(batch, func(c *lastSeqCall) *error { return &c.err }, func(c *lastSeqCall) context.Context { return c.ctx },
		lastSeqSharedBudget, "dialog last seq", func(ctx context.Context, live []*lastSeqCall) error {
			dialogs, users := make([]string, len(live)), make([]string, len(live))
			for i, c := range live {
				dialogs[i], users[i] = c.dialogID, c.userID
			}
			err := b.s.queryLastSeqs(ctx, dialogs, users, func(i int, seq int64) {
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

// sharedQuery runs one query for the calls of batch whose context is still
// live (the others get their context's error), under a context that no
// single caller's leaving cuts short; when it fails, every live call gets
// the error, named by what. errOf points at a call's error field.
func sharedQuery[C any](batch []C, errOf func(C) *error, ctxOf func(C) context.Context, budget time.Duration, what string,
	query func(ctx context.Context, live []C) error) {
	live := make([]C, 0, len(batch))
	for _, c := range batch {
		if *errOf(c) = ctxOf(c).Err(); *errOf(c) == nil {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := combine.SharedContext(live, ctxOf, budget)
	defer cancel()
	if err := query(ctx, live); err != nil {
		for _, c := range live {
			*errOf(c) = fmt.Errorf("%s: %w", what, err)
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
