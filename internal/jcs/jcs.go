package jcs

import (
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/segmentio/encoding/json"
)

// MaxSafeInteger is 2^53: the largest integer every larger one of which is
// no longer exactly representable as an IEEE-754 double.
const MaxSafeInteger = 1 << 53

// Errors of Canonicalize. Neither carries any part of the input.
var (
	// ErrSyntax: the input is not one JSON value that decodes cleanly.
	ErrSyntax = errors.New("jcs: invalid JSON")
	// ErrNumber: a number whose value is not finite, is an integer of
	// magnitude above 2^53, or is not exactly what its canonical form
	// denotes.
	ErrNumber = errors.New("jcs: number out of range")
	// ErrTooLarge: the canonical form is longer than the maximum given to
	// CanonicalizeMax.
	ErrTooLarge = errors.New("jcs: canonical form too large")
)

// CanonicalizeMax returns the RFC 8785 canonical form of one JSON value: object
// members sorted by the UTF-16 code units of their names, no insignificant
// whitespace, strings in the ECMAScript JSON.stringify form and numbers as
// ECMAScript Number::toString of their IEEE-754 double value.
//
// The caller checks the raw text first (invalid UTF-8, lone surrogates and
// duplicate names are not detected here: Go's decoder would repair or
// silently accept them). A number is refused with ErrNumber unless its
// canonical form denotes exactly the value of the token (see
// appendNumber): 9007199254740993.0, 1e16, 1e400 and 0.30000000000000001
// are refused, 0.1, 5e-324, 1.5 and -0 (canonical 0) are accepted. Hence
// the canonical text of an accepted value is itself accepted and
// canonicalizes to the same bytes.
//
// The canonical form is at most max bytes: a longer one is refused with
// ErrTooLarge. ErrSyntax and ErrNumber come first, as if the whole value
// had been canonicalized and then measured, but the length is found by one
// pass over the tokens before anything is decoded, so refusing a large
// value costs time linear in raw and no memory beyond a few bytes of stack.
func CanonicalizeMax(raw []byte, max int) ([]byte, error) {
	if !json.Valid(raw) {
		return nil, ErrSyntax
	}
	size, err := canonicalSize(raw)
	if err != nil {
		return nil, err
	}
	if size > max {
		return nil, ErrTooLarge
	}
	var v any
	rest, err := json.Parse(raw, &v, json.UseNumber)
	if err != nil || len(rest) > 0 {
		return nil, ErrSyntax
	}
	out, err := appendValue(make([]byte, 0, size), v)
	if err != nil {
		return nil, err
	}
	if len(out) > max { // raw the caller did not check: size was a lower bound
		return nil, ErrTooLarge
	}
	return out, nil
}

func appendValue(b []byte, v any) ([]byte, error) {
	switch t := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if t {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return AppendString(b, t), nil
	case json.Number:
		return appendNumber(b, string(t))
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendValue(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		names := make([]string, 0, len(t))
		for k := range t {
			names = append(names, k)
		}
		slices.SortFunc(names, compareUTF16)
		b = append(b, '{')
		for i, k := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendValue(b, t[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, ErrSyntax
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785 section 3.2.3),
// which differs from byte order for characters above U+FFFF against
// U+E000..U+FFFF. It does not allocate.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return compareRuneUTF16(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b) // the shorter one is a prefix of the other
}

// compareRuneUTF16 compares two different runes by their UTF-16 encodings:
// a rune above U+FFFF is a surrogate pair whose first unit (0xD800..0xDBFF)
// sorts below U+E000..U+FFFF and above U+0000..U+D7FF.
func compareRuneUTF16(a, b rune) int {
	ua, ub := utf16Key(a), utf16Key(b)
	if ua != ub {
		return cmpInt(ua, ub)
	}
	return cmpInt(a, b) // both above U+FFFF with the same high surrogate
}

// utf16Key is the first UTF-16 code unit of r.
func utf16Key(r rune) rune {
	if r >= 0x10000 {
		return 0xD800 + (r-0x10000)>>10
	}
	return r
}

func cmpInt(a, b rune) int {
	if a < b {
		return -1
	}
	return 1
}

// AppendFloat appends f as ECMAScript Number::toString does (RFC 8785
// section 3.2.2.3): the shortest decimal that round-trips, plain notation for
// exponents -7 < e < 21, exponent notation otherwise; -0 is "0". f must be
// finite.
func AppendFloat(b []byte, f float64) []byte {
	if f == 0 {
		return append(b, '0')
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	// Shortest round-trip digits d1.d2...dk and exponent e, with
	// value = d1.d2...dk × 10^e; ECMAScript's n is e+1.
	var buf [32]byte
	digits, e := shortest(&buf, f)
	k, n := len(digits), e+1
	switch {
	case k <= n && n <= 21:
		b = append(b, digits...)
		for i := 0; i < n-k; i++ {
			b = append(b, '0')
		}
	case 0 < n && n <= 21:
		b = append(b, digits[:n]...)
		b = append(b, '.')
		b = append(b, digits[n:]...)
	case -6 < n && n <= 0:
		b = append(b, "0."...)
		for i := 0; i < -n; i++ {
			b = append(b, '0')
		}
		b = append(b, digits...)
	default:
		b = append(b, digits[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return b
}

// shortest returns the shortest round-trip decimal digits d1 d2 ... dk of
// the positive finite f and the exponent e with f = d1.d2...dk × 10^e,
// written into buf (no allocation). The digits have no trailing zero.
func shortest(buf *[32]byte, f float64) (digits []byte, e int) {
	s := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	k := 1
	for s[k] != 'e' {
		k++
	}
	for _, c := range s[k+2:] {
		e = e*10 + int(c-'0')
	}
	if s[k+1] == '-' {
		e = -e
	}
	if k == 1 {
		return s[:1], e
	}
	return append(s[:1], s[2:k]...), e // drop the '.'
}

// AppendString appends s as ECMAScript JSON.stringify does: '"' and '\\'
// escaped, control characters below U+0020 as \b \t \n \f \r or \u00xx
// (lower-case hex), everything else as literal UTF-8.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			b = append(b, '\\', '"')
		case c == '\\':
			b = append(b, '\\', '\\')
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	return append(b, '"')
}
