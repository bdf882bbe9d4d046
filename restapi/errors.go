package restapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/restapi/apierr"
	projectapi "github.com/han-app/gateway/restapi/project"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// Error is an API failure with its HTTP status and stable code (package
// apierr, shared with the handler packages mounted here). Handlers return
// it (or a domain error) and Server.fail renders it; every error body goes
// through writeError (its other callers are listed in
// docs/architecture.md).
type Error = apierr.Error

func apiErr(status int, code string) *Error { return apierr.New(status, code) }

// Common errors.
var (
	errUnauthorized        = apiErr(http.StatusUnauthorized, "unauthorized")
	errUserSessionRequired = apiErr(http.StatusForbidden, "user_session_required")
	errForbidden           = apierr.Forbidden
	errInvalidJSON         = apierr.InvalidJSON
	errPayloadTooLarge     = apiErr(http.StatusRequestEntityTooLarge, "payload_too_large")
	errRequestTimeout      = apiErr(http.StatusRequestTimeout, "request_timeout")
	errNotFound            = apiErr(http.StatusNotFound, "not_found")
	errMethodNotAllowed    = apierr.MethodNotAllowed
	errDatabaseUnavailable = apiErr(http.StatusServiceUnavailable, "database_unavailable")
	// errDatabaseBusy: PostgreSQL answers but the request's budget ran out
	// (pool wait, lock wait or statement); a retry a moment later usually
	// succeeds.
	errDatabaseBusy = apierr.NewRetry(http.StatusServiceUnavailable, "database_busy", 1)
	// errDialogBusy: this instance already holds as many sends into the
	// dialog as its queue allows (HAN_SEND_DIALOG_QUEUE); nothing written.
	errDialogBusy        = apierr.NewRetry(http.StatusServiceUnavailable, "dialog_busy", 1)
	errRedisUnavailable  = apierr.RedisUnavailable
	errRedisOOM          = apiErr(http.StatusServiceUnavailable, "redis_oom")
	errRedisExpiryDenied = apiErr(http.StatusServiceUnavailable, "redis_expiry_denied")
	errInternal          = apiErr(http.StatusInternalServerError, "internal")
)

// Blob store failures (store.ErrBlobStoreFull, store.ErrBlobStoreUnavailable).
var (
	// errBlobStoreFull: the blob store has no room for the upload; a
	// retry cannot succeed until space is freed.
	errBlobStoreFull = apiErr(http.StatusInsufficientStorage, "insufficient_storage")
	// errBlobStoreUnavailable: the blob store's files cannot be written or
	// read (folder gone or unwritable, descriptors exhausted, I/O error).
	// Some of these pass (descriptors come back), others need an operator,
	// so a retry waits a few seconds rather than one.
	errBlobStoreUnavailable = apierr.NewRetry(http.StatusServiceUnavailable, "blob_store_unavailable", 5)
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

// errorAnswer is one row of errorTable: the errors match reports get the
// answer e; a row with a log message also logs the error's kind, because
// such an error means something is wrong beyond the request.
type errorAnswer struct {
	match func(error) bool
	e     *Error
	log   string
	level slog.Level
}

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// errInvalidCursor answers a page cursor the service did not hand out, of a
// chat history or of a project listing.
var errInvalidCursor = apiErr(http.StatusBadRequest, "invalid_cursor")

// errorTable maps every error class a handler may return to its status and
// code; the first matching row wins, so a narrower class comes before a
// wider one it is part of. Errors no row matches are 500 internal.
var errorTable = []errorAnswer{
	{match: is(auth.ErrUnauthorized), e: errUnauthorized},
	{match: is(store.ErrDialogNotFound), e: apiErr(http.StatusNotFound, "dialog_not_found")},
	{match: is(store.ErrDialogBusy), e: errDialogBusy},
	{match: is(store.ErrUserNotFound), e: apiErr(http.StatusNotFound, "user_not_found")},
	{match: is(store.ErrInvalidCursor), e: errInvalidCursor},
	{match: is(project.ErrInvalidCursor), e: errInvalidCursor},
	// Logged because a field reached PostgreSQL without its own check.
	{match: store.IsPGUnstorableText, e: errInvalidJSON, log: "text refused by the database", level: slog.LevelWarn},
	{match: is(store.ErrAttachmentNotFound), e: apiErr(http.StatusNotFound, "attachment_not_found")},
	{match: is(store.ErrInvalidAttachment), e: errInvalidAttachment},
	{match: is(store.ErrAttachmentNotUploaded), e: apiErr(http.StatusConflict, "attachment_not_uploaded")},
	{match: is(store.ErrAttachmentUploaded), e: apiErr(http.StatusConflict, "attachment_already_uploaded")},
	// Logged at Error: only an operator can give the disk room or repair
	// the folder. The log names the kind, never the file's path.
	{match: is(store.ErrBlobStoreFull), e: errBlobStoreFull, log: "blob store full", level: slog.LevelError},
	{match: is(store.ErrBlobStoreUnavailable), e: errBlobStoreUnavailable, log: "blob store unavailable", level: slog.LevelError},
	{match: is(store.ErrStubTaskNotFound), e: apiErr(http.StatusNotFound, "safety_task_not_found")},
	{match: is(store.ErrInboxConflict), e: apiErr(http.StatusConflict, "inbox_conflict")},
	{match: is(project.ErrCacheKeyNotFound), e: projectapi.ErrCacheKeyNotFound},
	{match: is(project.ErrCacheKeyExists), e: projectapi.ErrCacheKeyExists},
	{match: is(project.ErrTopicNotFound), e: projectapi.ErrTopicNotFound},
	{match: is(project.ErrSubscriptionNotFound), e: projectapi.ErrSubscriptionNotFound},
	{match: is(project.ErrMessageNotFound), e: projectapi.ErrMessageNotFound},
	{match: is(project.ErrTopicNameTaken), e: projectapi.ErrTopicNameTaken},
	{match: is(project.ErrPublishConflict), e: projectapi.ErrPublishConflict},
	{match: is(project.ErrSubscriptionPaused), e: projectapi.ErrSubscriptionPaused},
	{match: is(project.ErrDeliveryPaused), e: projectapi.ErrDeliveryPaused},
	{match: is(project.ErrLeaseExpired), e: projectapi.ErrLeaseExpired},
	{match: is(project.ErrLeaseTokenMismatch), e: projectapi.ErrLeaseTokenMismatch},
	{match: is(project.ErrReceiptConflict), e: projectapi.ErrReceiptConflict},
	{match: is(project.ErrBudgetExhausted), e: projectapi.ErrBudgetExhausted},
	{match: is(project.ErrUnsafeEvictionPolicy), e: projectapi.ErrUnsafeEviction},
	{match: is(project.ErrDataStateInvalid), e: projectapi.ErrDataStateInvalid, log: "project data state invalid", level: slog.LevelWarn},
	{match: is(rds.ErrRedisOOM), e: errRedisOOM},
	{match: is(rds.ErrExpiryDenied), e: errRedisExpiryDenied},
	{match: is(rds.ErrRedisUnavailable), e: errRedisUnavailable},
	{match: is(rds.ErrRedisNoPerm), e: errRedisUnavailable},
	// The client went away; nobody reads the answer.
	{match: is(context.Canceled), e: apiErr(499, "client_closed_request")},
	// Before IsPGUnavailable: a pool wait that ran out is a deadline too,
	// but the server is up.
	{match: store.IsDatabaseBusy, e: errDatabaseBusy},
	{match: store.IsPGUnavailable, e: errDatabaseUnavailable, log: "database unavailable", level: slog.LevelWarn},
}

// handle adapts a handler that returns its failure instead of answering
// it: fail renders the returned error, so handlers never write an error
// body themselves.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.fail(w, r, err)
		}
	}
}

// fail maps any error to a response through errorTable; it and the few
// callers listed in docs/architecture.md are the only writers of error
// bodies. Only unexpected failures are logged, by kind and never with raw
// driver text that could carry values.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if !settlePendingLimit(w, r) {
		return // over its limit: answered 429 (or 503) as the limiter decides first
	}
	e := s.answer(r, err)
	settleDialogSpend(r, failedSendResult(err))
	s.metrics.countFailure(r, err, e)
	writeError(w, e)
}

func (s *Server) answer(r *http.Request, err error) *Error {
	var e *Error
	if errors.As(err, &e) || isRateLimited(err, &e) {
		return e
	}
	row := errorAnswer{e: errInternal, log: "internal error", level: slog.LevelError}
	for _, a := range errorTable {
		if a.match(err) {
			row = a
			break
		}
	}
	if row.log != "" {
		s.logger.LogAttrs(r.Context(), row.level, row.log,
			slog.String("request_id", requestID(r.Context())), slog.String("route", RouteTemplate(r)),
			slog.String("kind", store.Kind(err)))
	}
	return row.e
}
