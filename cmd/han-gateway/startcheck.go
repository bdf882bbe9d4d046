package main

import (
	"fmt"
	"log/slog"
	"strconv"

	"github.com/han-app/gateway/internal/config"
	"github.com/han-app/gateway/store"
)

// debugEndpoints reads HAN_DEBUG_ENDPOINTS as the other booleans are read
// (strconv.ParseBool: 1, t, true, 0, f, false in any case; unset is off).
// Anything else is refused: a value the program does not understand must
// not leave the endpoints off, or on, without a word.
func debugEndpoints(getenv func(string) string) (bool, error) {
	v := getenv(debugEnv)
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: must be true or false (or 1 or 0)", debugEnv)
	}
	return on, nil
}

// warnConfig logs the settings that start, but weaken a production
// instance: the debug endpoints, and a trusted proxy range that covers
// every address (each client then names its own address in the forwarding
// header, which lifts the per-address caps and rate limits).
func (m *Main) warnConfig() {
	cfg := m.Config
	if !config.IsProd(cfg.Env) {
		return
	}
	if m.Debug {
		m.Logger.Warn(debugEnv + " is on with a production HAN_ENV: /debug/memstats and /debug/pprof/ are served to loopback peers")
	}
	for _, p := range cfg.TrustedProxies {
		if p.Bits() == 0 {
			m.Logger.Warn("HAN_TRUSTED_PROXIES trusts every address with a production HAN_ENV: any client may set its own address "+
				"in the forwarding header, which lifts the per-address connection caps and rate limits",
				slog.String("prefix", p.String()))
		}
	}
}

// sendCommitters is HAN_SEND_COMMITTERS, at most the PostgreSQL pool's
// connections: each committer holds one while it writes, and more would
// only wait for a connection in the pool, with every other request.
func (m *Main) sendCommitters() int {
	n, most := m.Config.SendCommitters, int(m.pg.Config().MaxConns)
	if n > most {
		m.Logger.Warn("HAN_SEND_COMMITTERS is above the PostgreSQL pool's connections; using the pool size",
			slog.Int("set", n), slog.Int("using", most))
		return most
	}
	return n
}

// dbURLError is a start-up failure on a PostgreSQL URL: the variable that
// holds it, what failed and the error's kind. Never the error's text: pgx
// prints the user, host and database of a failed connection, and a
// password written without percent-encoding ends up there.
func dbURLError(name, what string, err error) error {
	return fmt.Errorf("%s: %s (%s)", name, what, store.Kind(err))
}

// directURLName is the variable that holds the migrations' URL:
// HAN_DATABASE_DIRECT_URL, or DATABASE_URL when it is not set.
func directURLName(cfg config.Config) string {
	if cfg.DatabaseDirectURL == cfg.DatabaseURL {
		return "DATABASE_URL"
	}
	return "HAN_DATABASE_DIRECT_URL"
}
