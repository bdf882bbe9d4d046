package store

import (
	"context"
	"fmt"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// Last-seen records. Every ended connection and every offline transition
// records the user's last-seen time (TouchLastSeen). They come in storms:
// a network blip or a proxy restart ends thousands of sockets of one
// instance at once, and a survivor's sweep of a dead instance turns all of
// its users offline together. Records that arrive together share one
// statement, as the first-sight user records do (users_batch.go), so a
// storm costs PostgreSQL one transaction per batch instead of one per
// socket, and holds at most lastSeenInFlight pool connections while the
// request path needs the rest.
const (
	lastSeenInFlight     = 1
	lastSeenBatchMax     = 512
	lastSeenSharedBudget = 5 * time.Second
)

// lastSeenSQL moves each user's last_seen_at forward to the latest time the
// arrays give them (never back). The rows are locked in id order first (the
// materialized l, read whole before its rows are updated), so two
// instances' batches that share users wait for each other in one order and
// never deadlock. Ids with no user row are ignored.
const lastSeenSQL = `WITH l AS MATERIALIZED (
		SELECT id FROM users WHERE id = ANY($1::text[]::uuid[]) ORDER BY id FOR NO KEY UPDATE)
	UPDATE users u SET last_seen_at = GREATEST(COALESCE(u.last_seen_at, v.t), v.t)
	FROM (SELECT x.id, max(x.t) AS t FROM unnest($1::text[]::uuid[], $2::timestamptz[]) AS x(id, t)
		JOIN l ON l.id = x.id GROUP BY x.id) v
	WHERE u.id = v.id`

// lastSeenCall is one record waiting in a batch.
type lastSeenCall struct {
	sharedCall
	userID string
	at     time.Time
}

func newLastSeenBatcher(s *Store) *stmtBatcher[*lastSeenCall] {
	return newStmtBatcher(lastSeenInFlight, lastSeenBatchMax, lastSeenSharedBudget, "touch last seen",
		func(ctx context.Context, live []*lastSeenCall) error {
			users, times := make([]string, len(live)), make([]time.Time, len(live))
			for i, c := range live {
				users[i], times[i] = c.userID, c.at
			}
			return s.execShared(ctx, lastSeenSQL, users, times)
		})
}

// LastSeenStats counts the TouchLastSeen records and the statements that
// wrote them (fewer than the records when records were batched).
func (s *Store) LastSeenStats() SubscribeCheckStats { return s.lastSeen.stats() }

// TouchLastSeen records that a connection of the user ended at t; the
// stored value only moves forward. Records of concurrent callers share one
// statement. An id that is not a UUID names no user and records nothing.
func (s *Store) TouchLastSeen(ctx context.Context, userID string, t time.Time) error {
	if err := s.lastSeen.begin(ctx); err != nil {
		return fmt.Errorf("touch last seen: %w", err)
	}
	if !ids.Valid(userID) {
		return nil
	}
	return s.lastSeen.do(&lastSeenCall{sharedCall: sharedCall{ctx: ctx}, userID: userID, at: t})
}
