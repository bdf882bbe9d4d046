package store

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/combine"
	"github.com/han-app/gateway/internal/ids"
)

// First-sight user records. Every authenticated request and handshake
// records its user (EnsureUser) unless the instance already knows the id; a
// freshly started instance knows none, so the reconnect storm after a
// restart would make one INSERT per client. Records that arrive together
// share one statement, as the subscribe checks do (realtime_batch.go): a
// lone record goes out at once, the rest queue while one is in flight.
const (
	ensureUsersInFlight     = 1
	ensureUsersBatchMax     = 512
	ensureUsersSharedBudget = 5 * time.Second
)

// ensureUsersSQL records each id of the array once (an id twice in one
// batch conflicts with itself and is skipped). The ids are inserted in uuid
// order, so two instances' batches that share new ids wait for each other
// in one order and never deadlock.
const ensureUsersSQL = `INSERT INTO users(id) SELECT u FROM unnest($1::text[]::uuid[]) AS u ORDER BY u ON CONFLICT DO NOTHING`

// ensureUserCall is one record waiting in a batch.
type ensureUserCall struct {
	ctx context.Context
	id  string
	err error
}

// ensureUsersBatcher sends concurrent EnsureUser records as shared
// statements. Safe for concurrent use.
type ensureUsersBatcher struct {
	s    *Store
	comb combine.Combiner[*ensureUserCall]

	calls, queries atomic.Uint64
}

func newEnsureUsersBatcher(s *Store) *ensureUsersBatcher {
	b := &ensureUsersBatcher{s: s}
	b.comb = combine.Combiner[*ensureUserCall]{Exec: b.exec, InFlight: ensureUsersInFlight, Max: ensureUsersBatchMax}
	return b
}

// EnsureUserStats counts the EnsureUser calls that had to write (the id
// was not known) and the statements that recorded them.
func (s *Store) EnsureUserStats() SubscribeCheckStats {
	return SubscribeCheckStats{Checks: s.ensureUsers.calls.Load(), Queries: s.ensureUsers.queries.Load()}
}

// record records id, batched with other callers' records. An id that is
// not a UUID goes alone, so its error is its own and no batch-mate's.
func (b *ensureUsersBatcher) record(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.calls.Add(1)
	if !ids.Valid(id) {
		b.queries.Add(1)
		_, err := b.s.reqExec(ctx, "INSERT INTO users(id) VALUES ($1) ON CONFLICT DO NOTHING", id)
		return err
	}
	c := &ensureUserCall{ctx: ctx, id: id}
	b.comb.Do(c)
	return c.err
}

// exec records the ids of the calls whose context is still live with one
// statement.
func (b *ensureUsersBatcher) exec(batch []*ensureUserCall) {
	b.queries.Add(1)
	sharedQuery(batch, func(c *ensureUserCall) *error { return &c.err }, func(c *ensureUserCall) context.Context { return c.ctx },
		ensureUsersSharedBudget, "record users", func(ctx context.Context, live []*ensureUserCall) error {
			users := make([]string, len(live))
			for i, c := range live {
				users[i] = c.id
			}
			_, err := b.s.reqExec(ctx, ensureUsersSQL, users)
			return err
		})
}
