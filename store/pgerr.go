package store

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// IsPGUnavailable reports whether err means PostgreSQL could not be reached
// (as opposed to a query that failed).
func IsPGUnavailable(err error) bool {
	var ne net.Error
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P: operator intervention (shutdown).
		return len(pe.Code) == 5 && (pe.Code[:2] == "08" || pe.Code[:3] == "57P")
	}
	return pgconn.SafeToRetry(err)
}

// IsPGUnstorableText reports whether PostgreSQL refused a value because
// text or jsonb cannot hold it: U+0000 in text (22021) or "\u0000" in a
// jsonb string (22P05). That is the request's fault, never a server error;
// handlers refuse such values with the field's own code before they get
// here, so this is the last resort for a field that lacks that check.
func IsPGUnstorableText(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "22021" || pe.Code == "22P05")
}

// Kind names err's class for logs and metric labels without its message
// text, which may quote values (a constraint's key, a Redis argument): a
// request that ran out of its database budget is "pg_busy", another
// PostgreSQL error "pg:" and its SQLSTATE, a project data-state refusal
// "redis_data_state_invalid", anything else what rds.Kind names it.
func Kind(err error) string {
	var pe *pgconn.PgError
	switch {
	case IsDatabaseBusy(err):
		return "pg_busy"
	case errors.As(err, &pe):
		return "pg:" + pe.Code
	case errors.Is(err, project.ErrDataStateInvalid):
		return "redis_data_state_invalid"
	}
	return rds.Kind(err)
}
