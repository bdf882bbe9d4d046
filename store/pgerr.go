package store

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// IsPGUnavailable reports whether err means PostgreSQL could not be reached
// (as opposed to a query that failed). A file's error is never PostgreSQL's,
// although its errno satisfies net.Error like a dropped connection's: a
// full or broken blob store must not send operators to a healthy database.
func IsPGUnavailable(err error) bool {
	if isFileError(err) {
		return false
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) {
		// The connection closed under the statement (a restart, a proxy
		// or the network cut it).
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P: operator intervention (shutdown).
		return len(pe.Code) == 5 && (pe.Code[:2] == "08" || pe.Code[:3] == "57P")
	}
	return pgconn.SafeToRetry(err)
}

// isFileError reports whether err came from the file system (a path or a
// rename failed) or the blob store, never from a socket.
func isFileError(err error) bool {
	var pe *fs.PathError
	var le *os.LinkError
	return errors.As(err, &pe) || errors.As(err, &le) ||
		errors.Is(err, ErrBlobStoreFull) || errors.Is(err, ErrBlobStoreUnavailable)
}

// IsPGUndefinedTable reports whether PostgreSQL refused a statement because
// a table it names does not exist (42P01): a database the migrations never
// ran on.
func IsPGUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
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
// "redis_data_state_invalid", a blob store failure "blob_store_full" or
// "blob_store_unavailable", anything else what rds.Kind names it.
func Kind(err error) string {
	var pe *pgconn.PgError
	switch {
	case IsDatabaseBusy(err):
		return "pg_busy"
	case errors.As(err, &pe):
		return "pg:" + pe.Code
	case errors.Is(err, project.ErrDataStateInvalid):
		return "redis_data_state_invalid"
	case errors.Is(err, ErrBlobStoreFull):
		return "blob_store_full"
	case errors.Is(err, ErrBlobStoreUnavailable):
		return "blob_store_unavailable"
	}
	return rds.Kind(err)
}
