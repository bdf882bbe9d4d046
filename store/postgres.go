package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PGConfig tunes the PostgreSQL pool. Zero values pick the defaults shown.
type PGConfig struct {
	MaxConns          int32         // zero value means 20
	MinConns          int32         // zero value means 2
	ConnectTimeout    time.Duration // zero value means 3s
	HealthCheckPeriod time.Duration // zero value means 15s
	// ExecMode is how pgx sends statements (HAN_DB_EXEC_MODE, ParseExecMode).
	// Zero value: what the URL's default_query_exec_mode says, else
	// cache_statement.
	ExecMode pgx.QueryExecMode
	// URLName is the variable that holds the URL, named when the URL does
	// not parse (the URL itself is never quoted: it holds a password).
	// Zero value: DATABASE_URL.
	URLName string
}

// ParseExecMode reads HAN_DB_EXEC_MODE. The empty string means "keep the
// default" (zero value). Accepted:
//
//   - cache_statement: named prepared statements cached per connection; the
//     fastest, for a direct connection to PostgreSQL only, because a
//     transaction-pooling proxy hands the next statement to a server
//     connection that never saw the PREPARE.
//   - cache_describe: statement descriptions cached per connection, each
//     statement parsed again in its one round trip.
//   - exec: one round trip per statement with an unnamed statement and text
//     parameters; safe behind a transaction-pooling proxy.
//   - simple_protocol: the simple query protocol, parameters interpolated
//     by pgx; safe behind a transaction-pooling proxy.
//
// describe_exec is refused: it describes an unnamed statement in one round
// trip and executes it in a second one, which a transaction-pooling proxy
// may send to another server connection.
func ParseExecMode(s string) (pgx.QueryExecMode, error) {
	switch s {
	case "":
		return 0, nil
	case "cache_statement":
		return pgx.QueryExecModeCacheStatement, nil
	case "cache_describe":
		return pgx.QueryExecModeCacheDescribe, nil
	case "exec":
		return pgx.QueryExecModeExec, nil
	case "simple_protocol":
		return pgx.QueryExecModeSimpleProtocol, nil
	}
	return 0, errors.New("must be cache_statement, cache_describe, exec or simple_protocol")
}

// OpenPG opens a pgx pool; it does not wait for the server to answer (the
// readiness probe reports that). pool_max_conns and pool_min_conns in the
// URL take precedence over the defaults (not over PGConfig); so does
// default_query_exec_mode, but describe_exec is refused there as in
// HAN_DB_EXEC_MODE.
func OpenPG(ctx context.Context, url string, c PGConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		name := c.URLName
		if name == "" {
			name = "DATABASE_URL"
		}
		return nil, fmt.Errorf("store: invalid %s", name)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = 20
	}
	if c.MaxConns > 0 {
		cfg.MaxConns = c.MaxConns
	}
	if !strings.Contains(url, "pool_min_conns") {
		cfg.MinConns = min(2, cfg.MaxConns)
	}
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
	if c.ExecMode != 0 {
		cfg.ConnConfig.DefaultQueryExecMode = c.ExecMode
	}
	if cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeDescribeExec {
		// Two round trips per statement, which a pooling proxy may send
		// to two different server connections: refused however it is set.
		return nil, errors.New("store: default_query_exec_mode=describe_exec in the PostgreSQL URL is not supported; use HAN_DB_EXEC_MODE")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres pool: %w", err)
	}
	return pool, nil
}

// OpenReadinessPG opens the readiness probe's own PostgreSQL connection: a
// pool of exactly one connection, apart from the request pool, so a request
// pool with every connection busy is not mistaken for PostgreSQL being
// down. It keeps the connection open and re-dials it when it breaks. Close
// it with the process. It only pings (an empty simple-protocol query), so
// the exec mode does not matter to it, behind a pooling proxy or not.
func OpenReadinessPG(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("store: invalid DATABASE_URL")
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	cfg.HealthCheckPeriod = 15 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open readiness connection: %w", err)
	}
	return pool, nil
}
