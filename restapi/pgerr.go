package restapi

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// isPGUnavailable reports whether err means PostgreSQL could not be reached
// (as opposed to a query that failed).
func isPGUnavailable(err error) bool {
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

// isPGUnstorableText reports whether PostgreSQL refused a value because
// text or jsonb cannot hold it: U+0000 in text (22021) or "\u0000" in a
// jsonb string (22P05). That is the request's fault, never a server error;
// handlers refuse such values with the field's own code before they get
// here, so this is the last resort for a field that lacks that check.
func isPGUnstorableText(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "22021" || pe.Code == "22P05")
}

// errorKind names an error's class for logs without its message text, which
// may quote values (a constraint's key, a Redis argument).
func errorKind(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return "pg:" + pe.Code
	}
	for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(u) {
		err = u
	}
	return fmt.Sprintf("%T", err)
}
