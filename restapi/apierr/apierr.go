package apierr

import "net/http"

// Error is an API failure with its HTTP status and stable code.
type Error struct {
	Status     int
	Code       string
	RetryAfter int // seconds; 0 means no Retry-After header
}

func (e *Error) Error() string { return "restapi: " + e.Code }

// New is an Error without Retry-After.
func New(status int, code string) *Error { return &Error{Status: status, Code: code} }

// NewRetry is an Error whose answer carries Retry-After: retryAfter
// seconds.
func NewRetry(status int, code string, retryAfter int) *Error {
	return &Error{Status: status, Code: code, RetryAfter: retryAfter}
}

// The codes more than one handler package answers.
var (
	Forbidden            = New(http.StatusForbidden, "forbidden")
	InvalidJSON          = New(http.StatusBadRequest, "invalid_json")
	MethodNotAllowed     = New(http.StatusMethodNotAllowed, "method_not_allowed")
	RedisUnavailable     = New(http.StatusServiceUnavailable, "redis_unavailable")
	UnsupportedMediaType = New(http.StatusUnsupportedMediaType, "unsupported_media_type")
)
