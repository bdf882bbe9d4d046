package restapi

import "net/http"

// ReadBody is the body reader of every JSON route (readBody).
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return readBody(w, r, limit)
}

// ErrPayloadTooLarge is the failure of a body over its limit.
var ErrPayloadTooLarge = errPayloadTooLarge
