package projectapi

import (
	"errors"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/restapi/apierr"
)

// members returns the top-level members of a body after the raw-body
// checks (jsonx); a problem inside a member with a code of its own (codes)
// maps to that code, anything else to invalid_json.
func members(b []byte, codes fieldCodes) (map[string]json.RawMessage, error) {
	m, err := jsonx.TopLevel(b)
	if err != nil {
		if e, ok := codes[fieldProblem(err, len(b))]; ok {
			return nil, e
		}
		return nil, apierr.InvalidJSON
	}
	return m, nil
}

// fieldProblem names the top-level member a jsonx refusal lies in, or ""
// when the problem is not inside one member's value (between members, in
// the structure, or a body cut short): then the body as a whole is
// malformed and the answer is invalid_json (docs/project-redis-api.md).
func fieldProblem(err error, n int) string {
	je, ok := errors.AsType[*jsonx.Error](err)
	if !ok || len(je.Path) == 0 || (je.Reason == jsonx.ReasonSyntax && je.Offset >= n) {
		return ""
	}
	return je.Path[0]
}

// positiveInt accepts a raw JSON number token written as a plain positive
// integer (no sign, fraction or exponent) not above max.
func positiveInt(raw []byte, max int64) (int64, bool) {
	if len(raw) == 0 || len(raw) > 19 || raw[0] == '0' {
		return 0, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 1 || n > max {
		return 0, false
	}
	return n, true
}

// stringToken decodes a raw JSON string token (already checked by jsonx:
// valid UTF-8, no lone surrogates); ok is false for any other token.
func stringToken(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// optionalString decodes an absent or string member; ok is false for any
// other token (null included).
func optionalString(raw json.RawMessage, present bool) (string, bool) {
	if !present {
		return "", true
	}
	return stringToken(raw)
}

// boolToken decodes a raw JSON true or false.
func boolToken(raw []byte) (v, ok bool) {
	switch string(raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// validName: 1..max bytes of UTF-8 without control characters (Cc).
func validName(s string, max int) bool {
	if len(s) == 0 || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.Is(unicode.Cc, r) {
			return false
		}
	}
	return true
}
