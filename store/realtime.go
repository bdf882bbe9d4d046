package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DialogLastSeq returns the dialog's last assigned seq if userID is a
// member (ErrDialogNotFound otherwise). The realtime subscribe reads it
// after the Redis SUBSCRIBE is confirmed.
func (s *Store) DialogLastSeq(ctx context.Context, dialogID, userID string) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT d.last_seq FROM dialogs d
		JOIN dialog_members m ON m.dialog_id = d.id AND m.user_id = $2 WHERE d.id = $1`, dialogID, userID).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrDialogNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("dialog last seq: %w", err)
	}
	return seq, nil
}

// DialogIDsForUser returns up to limit ids of the user's dialogs (presence
// transitions are published to each of them).
func (s *Store) DialogIDsForUser(ctx context.Context, userID string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT dialog_id::text FROM dialog_members WHERE user_id = $1
		ORDER BY dialog_id LIMIT $2`, userID, limit)
	if err != nil {
		return nil, fmt.Errorf("user dialogs: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("user dialogs: %w", err)
	}
	return out, nil
}

// TouchLastSeen records that a connection of the user ended at t; the
// stored value only moves forward.
func (s *Store) TouchLastSeen(ctx context.Context, userID string, t time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE users SET last_seen_at = GREATEST(COALESCE(last_seen_at, $2), $2) WHERE id = $1`, userID, t)
	if err != nil {
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
