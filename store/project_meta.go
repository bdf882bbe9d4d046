package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/store/project"
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
func (p ProjectInfo) Mirror() project.Mirror {
	return project.Mirror{CacheQuotaBytes: p.CacheQuotaBytes, DeliveryPaused: p.DeliveryPaused, LegacyDeadlineMs: p.LegacyDeadlineMs}
}

// ProjectAccess returns the project's metadata and userID's role in it in
// one query: ErrNotFound when the project does not exist, Role "" when the
// user is not a member.
func (s *Store) ProjectAccess(ctx context.Context, projectID, userID string) (ProjectInfo, error) {
	p := ProjectInfo{ID: projectID}
	var role *string
	var deadline *int64
	err := s.reqQueryRow(ctx, `SELECT cache_quota_bytes, delivery_paused, legacy_deadline_ms,
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

// ErrMirrorRestore is joined to a commit failure when the Redis mirror,
// already written for the change that did not commit, could not be put
// back (the caller logs it; the next write repairs the mirror).
var ErrMirrorRestore = errors.New("store: project mirror not restored")

// MirrorFunc writes the project metadata that Redis mirrors.
type MirrorFunc func(ctx context.Context, m project.Mirror) error

// mirrorRestoreTimeout bounds putting a mirror back after a failed commit;
// the request's own context may be what failed.
const mirrorRestoreTimeout = time.Second

// UpdateProjectSettings applies set and returns the project's metadata after
// the change (the role field is left empty). ErrNotFound when the project
// is gone.
//
// Both stores change together: mirror writes the new values to Redis while
// the PostgreSQL transaction is still open, and the transaction commits only
// after mirror succeeded, so a refused Redis write (OOM, outage) leaves
// PostgreSQL unchanged too. If the commit itself fails, mirror runs again
// with the values from before (best effort; ErrMirrorRestore is joined to
// the error when that fails as well). A nil mirror writes PostgreSQL only.
func (s *Store) UpdateProjectSettings(ctx context.Context, projectID string, set ProjectSettings, mirror MirrorFunc) (ProjectInfo, error) {
	p, before := ProjectInfo{ID: projectID}, ProjectInfo{ID: projectID}
	err := s.mirroredTx(ctx, mirror, func(ctx context.Context, tx pgx.Tx) (project.Mirror, project.Mirror, error) {
		var deadline *int64
		// The sub-select locks the row and reads the values from before
		// the change (restored into Redis should the commit fail).
		err := tx.QueryRow(ctx, `UPDATE projects p SET
			cache_quota_bytes = COALESCE($2, old.cache_quota_bytes),
			delivery_paused = COALESCE($3, old.delivery_paused)
			FROM (SELECT id, cache_quota_bytes, delivery_paused FROM projects WHERE id = $1 FOR UPDATE) old
			WHERE p.id = old.id
			RETURNING p.cache_quota_bytes, p.delivery_paused, p.legacy_deadline_ms, old.cache_quota_bytes, old.delivery_paused`,
			projectID, set.CacheQuotaBytes, set.DeliveryPaused).Scan(&p.CacheQuotaBytes, &p.DeliveryPaused, &deadline,
			&before.CacheQuotaBytes, &before.DeliveryPaused)
		if err != nil {
			return project.Mirror{}, project.Mirror{}, err
		}
		if deadline != nil {
			p.LegacyDeadlineMs, before.LegacyDeadlineMs = *deadline, *deadline
		}
		return before.Mirror(), p.Mirror(), nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return ProjectInfo{}, ErrNotFound
	}
	if err != nil {
		return ProjectInfo{}, fmt.Errorf("update project settings: %w", err)
	}
	return p, nil
}

// mirroredTx runs change in a request transaction; change returns the
// mirrored metadata before and after it. mirror(after) runs before the
// commit; when the commit fails, mirror(before) puts Redis back.
func (s *Store) mirroredTx(ctx context.Context, mirror MirrorFunc, change func(ctx context.Context, tx pgx.Tx) (before, after project.Mirror, err error)) error {
	var before project.Mirror
	mirrored := false
	err := s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		b, a, err := change(ctx, tx)
		if err != nil || mirror == nil {
			return err
		}
		if err := mirror(ctx, a); err != nil {
			return err
		}
		before, mirrored = b, true
		return nil
	})
	if err == nil || !mirrored {
		return err
	}
	// The mirror holds values PostgreSQL did not commit.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mirrorRestoreTimeout)
	defer cancel()
	if rerr := mirror(rctx, before); rerr != nil {
		return errors.Join(err, ErrMirrorRestore)
	}
	return err
}

// FixLegacyDeadline records candidateMs as the project's legacy deadline
// unless one is fixed already, and returns the deadline in force. The first
// writer wins: the row lock of the UPDATE serialises concurrent PUTs, and a
// fixed deadline is never moved (so an empty Redis restore cannot reopen it).
// Like UpdateProjectSettings, it commits only after mirror wrote the
// metadata (with the deadline in force) to Redis.
func (s *Store) FixLegacyDeadline(ctx context.Context, projectID string, candidateMs int64, mirror MirrorFunc) (int64, error) {
	var d int64
	err := s.mirroredTx(ctx, mirror, func(ctx context.Context, tx pgx.Tx) (project.Mirror, project.Mirror, error) {
		var after project.Mirror
		var old *int64
		err := tx.QueryRow(ctx, `UPDATE projects p SET legacy_deadline_ms = COALESCE(old.legacy_deadline_ms, $2)
			FROM (SELECT id, legacy_deadline_ms FROM projects WHERE id = $1 FOR UPDATE) old
			WHERE p.id = old.id
			RETURNING p.cache_quota_bytes, p.delivery_paused, p.legacy_deadline_ms, old.legacy_deadline_ms`,
			projectID, candidateMs).Scan(&after.CacheQuotaBytes, &after.DeliveryPaused, &after.LegacyDeadlineMs, &old)
		before := after
		before.LegacyDeadlineMs = 0
		if old != nil {
			before.LegacyDeadlineMs = *old
		}
		d = after.LegacyDeadlineMs
		return before, after, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("fix legacy deadline: %w", err)
	}
	return d, nil
}
