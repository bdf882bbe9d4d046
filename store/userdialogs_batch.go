package store

import (
	"context"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// Presence transition batching. A user's first connection (and last
// disconnection) is published to each of the user's dialogs, which reads
// the user's dialog ids (DialogIDsForUser). Reads that arrive together —
// thousands in a connect or reconnect storm — share one statement, the way
// the subscribe checks do (realtime_batch.go): a lone read goes out at once
// (or after the realtime linger), the rest queue while a query is in
// flight.
const (
	// One query at a time, as the subscribe checks (lastSeqInFlight).
	userDialogsInFlight     = 1
	userDialogsBatchMax     = 256
	userDialogsSharedBudget = 5 * time.Second
)

// userDialogsSQL answers, for each (user, limit) pair of the arrays, the
// ids of the user's limit most recent dialogs, newest first, in the order
// the dialog listing shows them (creation time, then id, both descending);
// i is the pair's 1-based position. Each user's rows are the first limit
// entries of dialog_members_listing_idx (user_id, dialog_created_at DESC,
// dialog_id DESC), read in order, however many dialogs the user is in. The
// outer ORDER BY keeps each user's rows in that order; it sorts only the
// rows the batch returns.
const userDialogsSQL = `SELECT r.i, d.dialog_id::text
	FROM unnest($1::text[]::uuid[], $2::int[]) WITH ORDINALITY AS r(user_id, lim, i)
	CROSS JOIN LATERAL (SELECT m.dialog_id, m.dialog_created_at FROM dialog_members m WHERE m.user_id = r.user_id
		ORDER BY m.dialog_created_at DESC, m.dialog_id DESC LIMIT r.lim) d
	ORDER BY r.i, d.dialog_created_at DESC, d.dialog_id DESC`

// userDialogsCall is one read waiting in a batch.
type userDialogsCall struct {
	sharedCall
	userID  string
	limit   int
	dialogs []string
}

func newUserDialogsBatcher(s *Store) *stmtBatcher[*userDialogsCall] {
	return newStmtBatcher(userDialogsInFlight, userDialogsBatchMax, userDialogsSharedBudget, "user dialogs",
		func(ctx context.Context, live []*userDialogsCall) error {
			users, limits := make([]string, len(live)), make([]int32, len(live))
			for i, c := range live {
				users[i], limits[i] = c.userID, int32(min(c.limit, 1<<30))
			}
			err := s.queryUserDialogs(ctx, users, limits, func(i int, dialog string) {
				if i >= 1 && i <= len(live) {
					live[i-1].dialogs = append(live[i-1].dialogs, dialog)
				}
			})
			if err != nil { // no answer from a query that failed part way
				for _, c := range live {
					c.dialogs = nil
				}
			}
			return err
		})
}

// UserDialogsStats counts DialogIDsForUser reads and the queries that
// answered them (fewer than the reads when reads were batched).
func (s *Store) UserDialogsStats() SubscribeCheckStats { return s.userDialogs.stats() }

// readUserDialogs answers one user's dialogs, batched with other callers'
// reads.
func (s *Store) readUserDialogs(ctx context.Context, userID string, limit int) ([]string, error) {
	if err := s.userDialogs.begin(ctx); err != nil {
		return nil, err
	}
	// A non-UUID id names no member; keeping it out of the arrays keeps one
	// caller's bad input from failing the batch.
	if !ids.Valid(userID) || limit <= 0 {
		return nil, nil
	}
	c := &userDialogsCall{sharedCall: sharedCall{ctx: ctx}, userID: userID, limit: limit}
	err := s.userDialogs.do(c)
	return c.dialogs, err
}

// queryUserDialogs runs userDialogsSQL and calls row for each dialog.
func (s *Store) queryUserDialogs(ctx context.Context, users []string, limits []int32, row func(i int, dialog string)) error {
	rows, err := s.pool.Query(ctx, userDialogsSQL, users, limits)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			i      int64
			dialog string
		)
		if err := rows.Scan(&i, &dialog); err != nil {
			return err
		}
		row(int(i), dialog)
	}
	return rows.Err()
}
