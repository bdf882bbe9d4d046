package rds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Kind names err's class for log lines and metric labels without its text,
// which may quote values (a key, a Redis argument, a constraint's row). It
// is the one classifier of the service: every package logs or counts
// errors through it (the PostgreSQL store adds its error codes in
// store.Kind), so one failure gets one name wherever it is reported.
//
// The names: "none" for nil; the name an error made by Named carries;
// "redis_oom", "redis_expiry_denied", "redis_noperm" and
// "redis_unavailable" for the Redis sentinels; "closed" for a closed
// client; "timeout" for a passed deadline or a network timeout; "canceled";
// "EOF"; the system error of a failed call ("connection refused"); "pg:"
// and the SQLSTATE of a PostgreSQL error (one with a SQLState method, as
// pgconn's has: a package below the store that sees one logs its code, not
// its Go type); otherwise the Go type of the innermost wrapped error.
func Kind(err error) string {
	var named *namedError
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &named):
		return named.kind
	case errors.Is(err, ErrRedisOOM):
		return "redis_oom"
	case errors.Is(err, ErrExpiryDenied):
		return "redis_expiry_denied"
	case errors.Is(err, ErrRedisNoPerm):
		return "redis_noperm"
	case errors.Is(err, ErrRedisUnavailable):
		return "redis_unavailable"
	case errors.Is(err, redis.ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, io.EOF):
		return "EOF"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return "pg:" + coded.SQLState()
	}
	for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(u) {
		err = u
	}
	return fmt.Sprintf("%T", err)
}

// Named returns a sentinel error with the message msg that Kind reports as
// kind, for a package's own failure classes (a lost Pub/Sub canary).
func Named(kind, msg string) error { return &namedError{kind: kind, msg: msg} }

type namedError struct{ kind, msg string }

func (e *namedError) Error() string { return e.msg }
