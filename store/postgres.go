package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PGConfig tunes the PostgreSQL pool. Zero values pick the defaults shown.
type PGConfig struct {
	MaxConns          int32         // zero value means 20
	MinConns          int32         // zero value means 2
	ConnectTimeout    time.Duration // zero value means 3s
	HealthCheckPeriod time.Duration // zero value means 15s
}

// OpenPG opens a pgx pool; it does not wait for the server to answer (the
// readiness probe reports that).
func OpenPG(ctx context.Context, url string, c PGConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("store: invalid DATABASE_URL")
	}
	cfg.MaxConns = 20
	if c.MaxConns > 0 {
		cfg.MaxConns = c.MaxConns
	}
	cfg.MinConns = 2
	if c.MinConns > 0 {
		cfg.MinConns = c.MinConns
	}
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	if c.ConnectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = c.ConnectTimeout
	}
	cfg.HealthCheckPeriod = 15 * time.Second
	if c.HealthCheckPeriod > 0 {
		cfg.HealthCheckPeriod = c.HealthCheckPeriod
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres pool: %w", err)
	}
	return pool, nil
}
