package restapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// Error is an API failure with its HTTP status and stable code. Handlers
// return it (or a domain error) and Server.fail renders it; every error body
// goes through writeError (its other callers are listed in
// docs/architecture.md).
type Error struct {
	Status     int
	Code       string
	RetryAfter int // seconds; 0 means no Retry-After header
}

func (e *Error) Error() string { return "restapi: " + e.Code }

func apiErr(status int, code string) *Error { return &Error{Status: status, Code: code} }

// Common errors.
var (
	errUnauthorized        = apiErr(http.StatusUnauthorized, "unauthorized")
	errUserSessionRequired = apiErr(http.StatusForbidden, "user_session_required")
	errForbidden           = apiErr(http.StatusForbidden, "forbidden")
	errInvalidJSON         = apiErr(http.StatusBadRequest, "invalid_json")
	errPayloadTooLarge     = apiErr(http.StatusRequestEntityTooLarge, "payload_too_large")
	errRequestTimeout      = apiErr(http.StatusRequestTimeout, "request_timeout")
	errNotFound            = apiErr(http.StatusNotFound, "not_found")
	errMethodNotAllowed    = apiErr(http.StatusMethodNotAllowed, "method_not_allowed")
	errDatabaseUnavailable = apiErr(http.StatusServiceUnavailable, "database_unavailable")
	// errDatabaseBusy: PostgreSQL answers but the request's budget ran out
	// (pool wait, lock wait or statement); a retry a moment later usually
	// succeeds.
	errDatabaseBusy      = &Error{Status: http.StatusServiceUnavailable, Code: "database_busy", RetryAfter: 1}
	errRedisUnavailable  = apiErr(http.StatusServiceUnavailable, "redis_unavailable")
	errRedisOOM          = apiErr(http.StatusServiceUnavailable, "redis_oom")
	errRedisExpiryDenied = apiErr(http.StatusServiceUnavailable, "redis_expiry_denied")
	errInternal          = apiErr(http.StatusInternalServerError, "internal")
)

// writeError writes exactly {"error":"<code>"}.
func writeError(w http.ResponseWriter, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write([]byte(`{"error":"` + e.Code + `"}`))
}

// fail maps any error to a response. Only unexpected failures are logged,
// by kind and never with raw driver text that could carry values.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	switch {
	case errors.As(err, &e):
	case isRateLimited(err, &e):
	case errors.Is(err, auth.ErrUnauthorized):
		e = errUnauthorized
	case errors.Is(err, store.ErrDialogNotFound):
		e = apiErr(http.StatusNotFound, "dialog_not_found")
	case errors.Is(err, store.ErrUserNotFound):
		e = apiErr(http.StatusNotFound, "user_not_found")
	case errors.Is(err, store.ErrInvalidCursor):
		e = apiErr(http.StatusBadRequest, "invalid_cursor")
	case isPGUnstorableText(err):
		e = errInvalidJSON
		// Logged because a field reached PostgreSQL without its own check.
		s.logger.LogAttrs(r.Context(), slog.LevelWarn, "text refused by the database",
			slog.String("request_id", requestID(r.Context())), slog.String("route", RouteTemplate(r)),
			slog.String("kind", errorKind(err)))
	case errors.Is(err, store.ErrAttachmentNotFound):
		e = apiErr(http.StatusNotFound, "attachment_not_found")
	case errors.Is(err, store.ErrInvalidAttachment):
		e = errInvalidAttachment
	case errors.Is(err, store.ErrAttachmentNotUploaded):
		e = apiErr(http.StatusConflict, "attachment_not_uploaded")
	case errors.Is(err, store.ErrAttachmentUploaded):
		e = apiErr(http.StatusConflict, "attachment_already_uploaded")
	case errors.Is(err, store.ErrStubTaskNotFound):
		e = apiErr(http.StatusNotFound, "safety_task_not_found")
	case errors.Is(err, store.ErrInboxConflict):
		e = apiErr(http.StatusConflict, "inbox_conflict")
	case errors.Is(err, store.ErrCacheKeyNotFound):
		e = errCacheKeyNotFound
	case errors.Is(err, store.ErrCacheKeyExists):
		e = errCacheKeyExists
	case errors.Is(err, store.ErrTopicNotFound):
		e = errTopicNotFound
	case errors.Is(err, store.ErrSubscriptionNotFound):
		e = errSubscriptionNotFound
	case errors.Is(err, store.ErrMessageNotFound):
		e = apiErr(http.StatusNotFound, "message_not_found")
	case errors.Is(err, store.ErrTopicNameTaken):
		e = apiErr(http.StatusConflict, "topic_name_taken")
	case errors.Is(err, store.ErrPublishConflict):
		e = apiErr(http.StatusConflict, "publish_conflict")
	case errors.Is(err, store.ErrSubscriptionPaused):
		e = apiErr(http.StatusConflict, "subscription_paused")
	case errors.Is(err, store.ErrDeliveryPaused):
		e = apiErr(http.StatusConflict, "delivery_paused")
	case errors.Is(err, store.ErrLeaseExpired):
		e = apiErr(http.StatusConflict, "lease_expired")
	case errors.Is(err, store.ErrLeaseTokenMismatch):
		e = apiErr(http.StatusConflict, "lease_token_mismatch")
	case errors.Is(err, store.ErrReceiptConflict):
		e = apiErr(http.StatusConflict, "receipt_conflict")
	case errors.Is(err, store.ErrBudgetExhausted):
		e = apiErr(http.StatusConflict, "budget_exhausted")
	case errors.Is(err, store.ErrUnsafeEvictionPolicy):
		e = errUnsafeEviction
	case errors.Is(err, store.ErrDataStateInvalid):
		e = errDataStateInvalid
		s.logger.LogAttrs(r.Context(), slog.LevelWarn, "project data state invalid",
			slog.String("request_id", requestID(r.Context())), slog.String("route", RouteTemplate(r)))
	case errors.Is(err, rds.ErrRedisOOM):
		e = errRedisOOM
	case errors.Is(err, rds.ErrExpiryDenied):
		e = errRedisExpiryDenied
	case errors.Is(err, rds.ErrRedisUnavailable), errors.Is(err, rds.ErrRedisNoPerm):
		e = errRedisUnavailable
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
		e = apiErr(499, "client_closed_request")
	case store.IsDatabaseBusy(err):
		// Before isPGUnavailable: a pool wait that ran out is a deadline
		// too, but the server is up.
		e = errDatabaseBusy
	case isPGUnavailable(err):
		e = errDatabaseUnavailable
		s.logger.LogAttrs(r.Context(), slog.LevelWarn, "database unavailable",
			slog.String("request_id", requestID(r.Context())), slog.String("kind", errorKind(err)))
	default:
		e = errInternal
		s.logger.LogAttrs(r.Context(), slog.LevelError, "internal error",
			slog.String("request_id", requestID(r.Context())), slog.String("kind", errorKind(err)))
	}
	s.metrics.countFailure(r, err, e)
	writeError(w, e)
}
