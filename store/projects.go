package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Project roles, weakest first.
const (
	RoleRead  = "read"
	RoleWrite = "write"
	RoleAdmin = "admin"
)

// ErrInvalidRole is returned for a role outside read|write|admin.
var ErrInvalidRole = errors.New("store: invalid project role")

// ProjectMember is a user's role in a project.
type ProjectMember struct {
	UserID string
	Role   string
}

// ErrProjectExists is CreateNewProject's refusal of an id a project
// already has; nothing was written.
var ErrProjectExists = errors.New("store: project already exists")

// CreateProject creates a project (or renames an existing one with that id)
// and upserts its members, creating unseen users; it may be repeated.
func (s *Store) CreateProject(ctx context.Context, id, name string, members []ProjectMember) error {
	return s.createProject(ctx, id, name, members, true)
}

// CreateNewProject is CreateProject for an id no project has yet: an
// existing project with that id is refused with ErrProjectExists and left
// as it was (its name and its members' roles).
func (s *Store) CreateNewProject(ctx context.Context, id, name string, members []ProjectMember) error {
	return s.createProject(ctx, id, name, members, false)
}

func (s *Store) createProject(ctx context.Context, id, name string, members []ProjectMember, update bool) error {
	for _, m := range members {
		if m.Role != RoleRead && m.Role != RoleWrite && m.Role != RoleAdmin {
			return ErrInvalidRole
		}
	}
	insert := `INSERT INTO projects(id, name) VALUES ($1,$2) ON CONFLICT (id) DO NOTHING`
	if update {
		insert = `INSERT INTO projects(id, name) VALUES ($1,$2) ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name`
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, insert, id, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrProjectExists
		}
		for _, m := range members {
			if _, err := tx.Exec(ctx, "INSERT INTO users(id) VALUES ($1) ON CONFLICT DO NOTHING", m.UserID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO project_members(project_id, user_id, role) VALUES ($1,$2,$3)
				ON CONFLICT (project_id, user_id) DO UPDATE SET role = EXCLUDED.role`, id, m.UserID, m.Role); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create project: %w", err)
	}
	return nil
}

// ProjectRole returns the user's role in the project: ErrNotFound when the
// project does not exist, "" when it exists and the user is not a member.
func (s *Store) ProjectRole(ctx context.Context, projectID, userID string) (string, error) {
	var exists bool
	var role *string
	err := s.reqQueryRow(ctx, `SELECT true, (SELECT role FROM project_members WHERE project_id=$1 AND user_id=$2)
		FROM projects WHERE id=$1`, projectID, userID).Scan(&exists, &role)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("project role: %w", err)
	}
	if role == nil {
		return "", nil
	}
	return *role, nil
}

// ProjectExists reports whether PostgreSQL has the project's row: the
// gateway serves a project's Redis keys only once it has found that row,
// so a tool that writes them first checks here.
func (s *Store) ProjectExists(ctx context.Context, projectID string) (bool, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM projects WHERE id=$1)", projectID).Scan(&exists); err != nil {
		return false, fmt.Errorf("project exists: %w", err)
	}
	return exists, nil
}
