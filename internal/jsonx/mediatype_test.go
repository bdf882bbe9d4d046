package jsonx

import "testing"

// A body is read as JSON only under a Content-Type that says it is JSON in
// UTF-8; a type that merely starts with application/json, or another
// charset, is not.
func TestMediaTypeOK(t *testing.T) {
	for ct, want := range map[string]bool{
		"":                                  true,
		"application/json":                  true,
		"Application/JSON":                  true,
		"application/json; charset=utf-8":   true,
		"application/json;charset=UTF-8":    true,
		`application/json; charset="utf-8"`: true,
		"application/json; charset=utf8":    true,
		"application/json; foo=bar":         true,
		"application/jsonx":                 false,
		"application/json-seq":              false,
		"application/json; charset=latin1":  false,
		"application/json; charset=utf-16":  false,
		"application/json; charset":         false,
		"text/json":                         false,
		"text/plain":                        false,
		"application/x-www-form-urlencoded": false,
		"multipart/form-data; boundary=x":   false,
		"application/json, text/plain":      false,
	} {
		if got := MediaTypeOK(ct); got != want {
			t.Errorf("MediaTypeOK(%q) = %v, want %v", ct, got, want)
		}
	}
}
