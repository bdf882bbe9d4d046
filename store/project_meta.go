package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ProjectInfo is what one request of the project Redis API needs from
// PostgreSQL: the caller's role and the project metadata that PostgreSQL
// holds as the truth (so an empty Redis restore never reopens a fixed legacy
// deadline) and Redis mirrors.
type ProjectInfo struct {
	ID   string
	Role string // "" when the caller is not a member
	// CacheQuotaBytes caps one cache item (default 1 MiB).
	CacheQuotaBytes int64
	DeliveryPaused  bool
	// LegacyDeadlineMs is the fixed deadline of legacy cache entries in
	// epoch ms; 0 while not fixed.
	LegacyDeadlineMs int64
}

// Mirror is the part of the metadata that Redis mirrors.
func (p ProjectInfo) Mirror() ProjectMirror {
	return ProjectMirror{CacheQuotaBytes: p.CacheQuotaBytes, DeliveryPaused: p.DeliveryPaused, LegacyDeadlineMs: p.LegacyDeadlineMs}
}

// ProjectAccess returns the project's metadata and userID's role in it in
// one query: ErrNotFound when the project does not exist, Role "" when the
// user is not a member.
func (s *Store) ProjectAccess(ctx context.Context, projectID, userID string) (ProjectInfo, error) {
	p := ProjectInfo{ID: projectID}
	var role *string
	var deadline *int64
	err := s.pool.QueryRow(ctx, `SELECT cache_quota_bytes, delivery_paused, legacy_deadline_ms,
		(SELECT role FROM project_members WHERE project_id = $1 AND user_id = $2)
		FROM projects WHERE id = $1`, projectID, userID).Scan(&p.CacheQuotaBytes, &p.DeliveryPaused, &deadline, &role)
	if errors.Is(err, pgx.ErrNoRows) {
		return ProjectInfo{}, ErrNotFound
	}
	if err != nil {
		return ProjectInfo{}, fmt.Errorf("project access: %w", err)
	}
	if role != nil {
		p.Role = *role
	}
	if deadline != nil {
		p.LegacyDeadlineMs = *deadline
	}
	return p, nil
}

// ProjectSettings changes one setting; nil fields are left alone.
type ProjectSettings struct {
	CacheQuotaBytes *int64
	DeliveryPaused  *bool
}

// UpdateProjectSettings applies s and returns the project's metadata after
// the change (the role field is left empty). ErrNotFound when the project
// is gone.
func (s *Store) UpdateProjectSettings(ctx context.Context, projectID string, set ProjectSettings) (ProjectInfo, error) {
	p := ProjectInfo{ID: projectID}
	var deadline *int64
	err := s.pool.QueryRow(ctx, `UPDATE projects SET
		cache_quota_bytes = COALESCE($2, cache_quota_bytes),
		delivery_paused = COALESCE($3, delivery_paused)
		WHERE id = $1
		RETURNING cache_quota_bytes, delivery_paused, legacy_deadline_ms`,
		projectID, set.CacheQuotaBytes, set.DeliveryPaused).Scan(&p.CacheQuotaBytes, &p.DeliveryPaused, &deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return ProjectInfo{}, ErrNotFound
	}
	if err != nil {
		return ProjectInfo{}, fmt.Errorf("update project settings: %w", err)
	}
	if deadline != nil {
		p.LegacyDeadlineMs = *deadline
	}
	return p, nil
}

// FixLegacyDeadline records candidateMs as the project's legacy deadline
// unless one is fixed already, and returns the deadline in force. The first
// writer wins: the row lock of the UPDATE serialises concurrent PUTs, and a
// fixed deadline is never moved (so an empty Redis restore cannot reopen it).
func (s *Store) FixLegacyDeadline(ctx context.Context, projectID string, candidateMs int64) (int64, error) {
	var d int64
	err := s.pool.QueryRow(ctx, `UPDATE projects SET legacy_deadline_ms = COALESCE(legacy_deadline_ms, $2)
		WHERE id = $1 RETURNING legacy_deadline_ms`, projectID, candidateMs).Scan(&d)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("fix legacy deadline: %w", err)
	}
	return d, nil
}
