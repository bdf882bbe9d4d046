package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Runtime settings versioned in PostgreSQL (docs/runtime-settings.md):
// rate-limit policy overrides and named tunables. Every change of either table
// increments settings_head.version in the changing transaction (trigger,
// migration 0005).

// RateLimitPolicyRow is one rate_limit_policies row; Rules is its JSON array
// of {"family","limit","windowMs"}, validated by package settings.
type RateLimitPolicyRow struct {
	Route     string
	Algorithm string
	OnFailure string
	Rules     []byte
}

// SettingsHead names one settings state: settings_head's version and the
// stamp PostgreSQL draws anew on every change of that row. Two states share
// a version number only when PostgreSQL has gone back in time (a failover
// to a replica that missed the last change, a point-in-time restore) and
// reused it; their stamps still differ.
type SettingsHead struct {
	Version int64
	Stamp   string
}

// SettingsRows is one consistent read of every settings table.
type SettingsRows struct {
	SettingsHead
	Policies []RateLimitPolicyRow
	Tunables map[string][]byte // name → JSON value
}

// SettingsHead reads the state PostgreSQL is at (one-row read: the cheap
// check every instance makes on each refresh tick).
func (s *Store) SettingsHead(ctx context.Context) (SettingsHead, error) {
	var h SettingsHead
	if err := s.pool.QueryRow(ctx, "SELECT version, stamp::text FROM settings_head").Scan(&h.Version, &h.Stamp); err != nil {
		return SettingsHead{}, fmt.Errorf("settings head: %w", err)
	}
	return h, nil
}

// LoadSettings reads the state and every row in one REPEATABLE READ
// transaction, so the rows are exactly those of the state returned.
func (s *Store) LoadSettings(ctx context.Context) (SettingsRows, error) {
	out := SettingsRows{Tunables: map[string][]byte{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT version, stamp::text FROM settings_head").Scan(&out.Version, &out.Stamp); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT route, algorithm, on_failure, rules::text FROM rate_limit_policies ORDER BY route")
		if err != nil {
			return err
		}
		out.Policies, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (RateLimitPolicyRow, error) {
			var p RateLimitPolicyRow
			var rules string
			err := r.Scan(&p.Route, &p.Algorithm, &p.OnFailure, &rules)
			p.Rules = []byte(rules)
			return p, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, "SELECT name, value::text FROM runtime_settings ORDER BY name")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, value string
			if err := rows.Scan(&name, &value); err != nil {
				return err
			}
			out.Tunables[name] = []byte(value)
		}
		return rows.Err()
	})
	if err != nil {
		return SettingsRows{}, fmt.Errorf("load settings: %w", err)
	}
	return out, nil
}
