package jcs

import (
	"errors"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

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
)

// Canonicalize returns the RFC 8785 canonical form of one JSON value: object
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
func Canonicalize(raw []byte) ([]byte, error) {
	var v any
	rest, err := json.Parse(raw, &v, json.UseNumber)
	if err != nil || len(rest) > 0 {
		return nil, ErrSyntax
	}
	out := make([]byte, 0, len(raw))
	return appendValue(out, v)
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
// U+E000..U+FFFF.
func compareUTF16(a, b string) int {
	if a == b {
		return 0
	}
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	return slices.Compare(ua, ub)
}

// appendNumber writes a JSON number token in its canonical form. Every
// number is an IEEE-754 double, but a number is judged by its value, never
// by its spelling: it is refused (ErrNumber) when the value is not finite,
// when it is an integer of magnitude above 2^53 (1e16 as much as
// 10000000000000000), or when its canonical form denotes another decimal
// value than the token (9007199254740993.0 would become ...992, 0.1e-400
// would become 0). So the canonical form always denotes exactly the value
// that was sent, and canonicalizing it again gives the same bytes.
func appendNumber(b []byte, tok string) ([]byte, error) {
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, ErrSyntax
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, ErrNumber
	}
	if f == 0 {
		// Zero, or a value too small for a double (1e-400): only a true
		// zero keeps its value. Deciding this from the digits keeps an
		// exponent such as 1e-999999999 away from big.Rat.
		mant, _, _ := strings.Cut(strings.ToLower(tok), "e")
		if strings.Trim(mant, "-0.") != "" {
			return nil, ErrNumber
		}
		return append(b, '0'), nil
	}
	// A finite non-zero double bounds the token's exponent by the double
	// range plus its own digit count, so big.Rat stays small.
	exact, ok := new(big.Rat).SetString(tok)
	if !ok {
		return nil, ErrSyntax
	}
	if exact.IsInt() && new(big.Int).Abs(exact.Num()).Cmp(maxSafe) > 0 {
		return nil, ErrNumber
	}
	start := len(b)
	b = AppendFloat(b, f)
	canon, ok := new(big.Rat).SetString(string(b[start:]))
	if !ok || canon.Cmp(exact) != 0 {
		return nil, ErrNumber
	}
	return b, nil
}

var maxSafe = big.NewInt(MaxSafeInteger)

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
	s := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(s, "e")
	digits := strings.Replace(mant, ".", "", 1)
	e, _ := strconv.Atoi(exp)
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
