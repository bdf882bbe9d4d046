package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
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

// ErrMirrorRestore is joined to the error of a change that did not go
// through when the Redis mirror, which may hold what PostgreSQL did not
// commit (or miss what it did), could not be put in line with PostgreSQL
// (the caller logs it; the next settings change or cache PUT repairs the
// mirror).
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
// PostgreSQL unchanged too. When the change fails after Redis may have
// taken it (a mirror write without an answer, a failed or unanswered
// COMMIT), the mirror is rewritten from PostgreSQL's row (see mirroredTx).
// A nil mirror writes PostgreSQL only.
func (s *Store) UpdateProjectSettings(ctx context.Context, projectID string, set ProjectSettings, mirror MirrorFunc) (ProjectInfo, error) {
	p := ProjectInfo{ID: projectID}
	err := s.mirroredTx(ctx, projectID, mirror, func(ctx context.Context, tx pgx.Tx) (project.Mirror, error) {
		var deadline *int64
		err := tx.QueryRow(ctx, `UPDATE projects SET
			cache_quota_bytes = COALESCE($2, cache_quota_bytes),
			delivery_paused = COALESCE($3, delivery_paused)
			WHERE id = $1
			RETURNING cache_quota_bytes, delivery_paused, legacy_deadline_ms`,
			projectID, set.CacheQuotaBytes, set.DeliveryPaused).Scan(&p.CacheQuotaBytes, &p.DeliveryPaused, &deadline)
		if err != nil {
			return project.Mirror{}, err
		}
		if deadline != nil {
			p.LegacyDeadlineMs = *deadline
		}
		return p.Mirror(), nil
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
// mirrored metadata after it, and mirror writes that to Redis before the
// commit. When the change fails after mirror may have written (its write
// got no answer, or the COMMIT failed or got no answer: PostgreSQL may or
// may not hold the change), the mirror is rewritten from what PostgreSQL
// holds, read under the row's lock so that no other change's mirror write
// lands in between. Putting back the values read before the change would
// undo a change whose COMMIT went through unanswered, and a concurrent
// change committed since. A mirror write Redis refused (out of memory,
// denied, a key of the wrong type) wrote nothing: nothing to repair.
func (s *Store) mirroredTx(ctx context.Context, projectID string, mirror MirrorFunc, change func(ctx context.Context, tx pgx.Tx) (after project.Mirror, err error)) error {
	attempted := false
	err := s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		a, err := change(ctx, tx)
		if err != nil || mirror == nil {
			return err
		}
		err = mirror(ctx, a)
		attempted = err == nil || !mirrorRefused(err)
		return err
	})
	if err == nil || !attempted {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mirrorRestoreTimeout)
	defer cancel()
	if rerr := s.remirror(rctx, projectID, mirror); rerr != nil {
		return errors.Join(err, ErrMirrorRestore)
	}
	return err
}

// mirrorRefused reports whether a mirror write's error is Redis's refusal,
// which leaves the mirror as it was.
func mirrorRefused(err error) bool {
	return errors.Is(err, rds.ErrRedisOOM) || errors.Is(err, rds.ErrExpiryDenied) ||
		errors.Is(err, rds.ErrRedisNoPerm) || errors.Is(err, project.ErrDataStateInvalid)
}

// RemirrorProject writes the project's metadata as PostgreSQL holds it to
// Redis through mirror, holding the row's lock while it does, so no
// concurrent change's mirror write lands in between: it repairs a mirror
// that a change which failed left ahead of PostgreSQL. It takes at most
// mirrorRestoreTimeout, whatever ctx allows: the request it runs for has
// its answer already.
func (s *Store) RemirrorProject(ctx context.Context, projectID string, mirror MirrorFunc) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mirrorRestoreTimeout)
	defer cancel()
	return s.remirror(rctx, projectID, mirror)
}

// remirror writes the project's metadata as PostgreSQL holds it to Redis,
// holding the row's lock while it does. A project that is gone has nothing
// to mirror. ctx bounds it (its callers give it mirrorRestoreTimeout); the
// pool wait and the row lock's wait end with it, and the lock wait also by
// lock_timeout, so a held row fails the repair rather than hanging on.
func (s *Store) remirror(ctx context.Context, projectID string, mirror MirrorFunc) error {
	begin := fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d", mirrorRestoreTimeout.Milliseconds())
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: begin}, func(tx pgx.Tx) error {
		var m project.Mirror
		var deadline *int64
		err := tx.QueryRow(ctx, `SELECT cache_quota_bytes, delivery_paused, legacy_deadline_ms
			FROM projects WHERE id = $1 FOR UPDATE`, projectID).Scan(&m.CacheQuotaBytes, &m.DeliveryPaused, &deadline)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if deadline != nil {
			m.LegacyDeadlineMs = *deadline
		}
		return mirror(ctx, m)
	})
}

// FixLegacyDeadline records candidateMs as the project's legacy deadline
// unless one is fixed already, and returns the deadline in force. The first
// writer wins: the row lock of the UPDATE serialises concurrent PUTs, and a
// fixed deadline is never moved (so an empty Redis restore cannot reopen it).
// Like UpdateProjectSettings, it commits only after mirror wrote the
// metadata (with the deadline in force) to Redis.
func (s *Store) FixLegacyDeadline(ctx context.Context, projectID string, candidateMs int64, mirror MirrorFunc) (int64, error) {
	var d int64
	err := s.mirroredTx(ctx, projectID, mirror, func(ctx context.Context, tx pgx.Tx) (project.Mirror, error) {
		var after project.Mirror
		err := tx.QueryRow(ctx, `UPDATE projects SET legacy_deadline_ms = COALESCE(legacy_deadline_ms, $2)
			WHERE id = $1
			RETURNING cache_quota_bytes, delivery_paused, legacy_deadline_ms`,
			projectID, candidateMs).Scan(&after.CacheQuotaBytes, &after.DeliveryPaused, &after.LegacyDeadlineMs)
		d = after.LegacyDeadlineMs
		return after, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("fix legacy deadline: %w", err)
	}
	return d, nil
}
