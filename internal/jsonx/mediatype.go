package jsonx

import (
	"mime"
	"strings"
)

// MediaTypeOK reports whether a request's Content-Type lets its body be
// read as JSON text in UTF-8: none at all (a client that declares
// nothing), or application/json whose charset, if given, is UTF-8. A type
// that only begins like it (application/jsonx, application/json-seq) or a
// charset the bytes would have to be decoded from (latin1, utf-16) is not:
// reading such a body as UTF-8 JSON would store something other than what
// the client sent.
func MediaTypeOK(ct string) bool {
	if ct == "" || ct == "application/json" {
		return true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		return false
	}
	return true
}
