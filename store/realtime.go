package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DialogLastSeq returns the dialog's last assigned seq if userID is a
// member (ErrDialogNotFound otherwise, also for ids that are not UUIDs).
// The realtime subscribe checks membership with it before the Redis
// SUBSCRIBE and reads the seq again after the SUBSCRIBE is confirmed.
// Concurrent calls share one query (realtime_batch.go); each still gets the
// answer a query of its own would have given.
func (s *Store) DialogLastSeq(ctx context.Context, dialogID, userID string) (int64, error) {
	seq, found, err := s.checkLastSeq(ctx, dialogID, userID)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, ErrDialogNotFound
	}
	return seq, nil
}

// DialogIDsForUser returns the ids of the user's limit most recent
// dialogs, newest first in the dialog listing's order (presence transitions
// are published to each of them).
func (s *Store) DialogIDsForUser(ctx context.Context, userID string, limit int) ([]string, error) {
	return s.readUserDialogs(ctx, userID, limit)
}

// TouchLastSeenMany is TouchLastSeen for many users at once, one statement
// (a draining instance's teardown), locking the rows in the order the
// batched records do. Unknown users are ignored.
func (s *Store) TouchLastSeenMany(ctx context.Context, userIDs []string, t time.Time) error {
	if len(userIDs) == 0 {
		return nil
	}
	times := make([]time.Time, len(userIDs))
	for i := range times {
		times[i] = t
	}
	if _, err := s.pool.Exec(ctx, lastSeenSQL, userIDs, times); err != nil {
		return fmt.Errorf("touch last seen: %w", err)
	}
	return nil
}

// PresenceVisible reports whether viewer may see target's presence: the
// user themself or someone who shares a dialog with them. It also returns
// the target's persisted lastSeenAt (nil when none). A target that does not
// exist, or that the viewer may not see, is ErrUserNotFound.
func (s *Store) PresenceVisible(ctx context.Context, viewer, target string) (*time.Time, error) {
	var lastSeen *time.Time
	err := s.reqQueryRow(ctx, `SELECT u.last_seen_at FROM users u WHERE u.id = $2 AND ($1 = $2 OR EXISTS (
		SELECT 1 FROM dialog_members a JOIN dialog_members b ON a.dialog_id = b.dialog_id
		WHERE a.user_id = $1 AND b.user_id = $2))`, viewer, target).Scan(&lastSeen)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUserNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("presence visibility: %w", err)
	}
	return lastSeen, nil
}
