package store

import (
	"context"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// First-sight user records. Every authenticated request and handshake
// records its user (EnsureUser) unless the instance already knows the id; a
// freshly started instance knows none, so the reconnect storm after a
// restart would make one INSERT per client. Records that arrive together
// share one statement, as the subscribe checks do (realtime_batch.go): a
// lone record goes out at once (or after the realtime linger), the rest
// queue while one is in flight.
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
	sharedCall
	id string
}

func newEnsureUsersBatcher(s *Store) *stmtBatcher[*ensureUserCall] {
	return newStmtBatcher(ensureUsersInFlight, ensureUsersBatchMax, ensureUsersSharedBudget, "record users",
		func(ctx context.Context, live []*ensureUserCall) error {
			users := make([]string, len(live))
			for i, c := range live {
				users[i] = c.id
			}
			_, err := s.reqExec(ctx, ensureUsersSQL, users)
			return err
		})
}

// EnsureUserStats counts the EnsureUser calls that had to write (the id
// was not known) and the statements that recorded them.
func (s *Store) EnsureUserStats() SubscribeCheckStats { return s.ensureUsers.stats() }

// recordUser records id, batched with other callers' records. An id that
// is not a UUID goes alone, so its error is its own and no batch-mate's.
func (s *Store) recordUser(ctx context.Context, id string) error {
	b := s.ensureUsers
	if err := b.begin(ctx); err != nil {
		return err
	}
	if !ids.Valid(id) {
		b.queries.Add(1)
		_, err := s.reqExec(ctx, "INSERT INTO users(id) VALUES ($1) ON CONFLICT DO NOTHING", id)
		return err
	}
	return b.do(&ensureUserCall{sharedCall: sharedCall{ctx: ctx}, id: id})
}
