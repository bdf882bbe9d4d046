package jcs

import (
	"math"
	"strconv"
)

// maxDigits is the most significant digits the shortest round-trip form of
// a double has (17). A number with more significant digits (leading and
// trailing zeros do not count) differs from every canonical form, so it is
// refused without arithmetic.
const maxDigits = 17

// maxExpDigits bounds the significant digits of a token's exponent. A
// larger exponent puts any non-zero value far outside the double range
// (above 1e308 or below 5e-324) whatever its digits, and zero is zero
// whatever its exponent.
const maxExpDigits = 9

// decimal is a number token reduced to its value: ±digits × 10^exp, with
// digits free of leading and trailing zeros ("" for zero).
type decimal struct {
	neg    bool
	buf    [maxDigits]byte
	n      int   // len(digits); 0 for zero
	exp    int64 // decimal exponent of the last significant digit
	tooBig bool  // more than maxDigits significant digits, or a huge exponent
}

func (d *decimal) digits() []byte { return d.buf[:d.n] }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// digitRun returns the offset after the run of decimal digits at tok[i:].
func digitRun[T string | []byte](tok T, i int) int {
	for i < len(tok) && isDigit(tok[i]) {
		i++
	}
	return i
}

// parseDecimal splits an RFC 8259 number token in one pass over it:
// [-] int [. frac] [e|E [+|-] exp]. Only maxDigits digits are ever copied
// and only maxExpDigits exponent digits are ever converted, so the cost is
// linear in the token's length however long it is.
func parseDecimal[T string | []byte](tok T) (d decimal, ok bool) {
	i := 0
	if i < len(tok) && tok[i] == '-' {
		d.neg = true
		i++
	}
	intLo := i
	i = digitRun(tok, i)
	intHi := i
	if intHi == intLo || (intHi-intLo > 1 && tok[intLo] == '0') {
		return d, false
	}
	fracLo, fracHi := i, i
	if i < len(tok) && tok[i] == '.' {
		fracLo = i + 1
		if i = digitRun(tok, fracLo); i == fracLo {
			return d, false
		}
		fracHi = i
	}
	exp, hugeExp, i, ok := parseExponent(tok, i)
	if !ok || i != len(tok) {
		return d, false
	}
	// The mantissa digits are tok[intLo:intHi] followed by
	// tok[fracLo:fracHi]; at(k) is the k-th of them.
	nInt, nAll := intHi-intLo, intHi-intLo+fracHi-fracLo
	at := func(k int) byte {
		if k < nInt {
			return tok[intLo+k]
		}
		return tok[fracLo+k-nInt]
	}
	first, last := 0, nAll-1
	for first < nAll && at(first) == '0' {
		first++
	}
	if first == nAll {
		return d, true // zero, whatever its exponent
	}
	for at(last) == '0' {
		last--
	}
	if last-first+1 > maxDigits || hugeExp {
		d.tooBig = true
		return d, true
	}
	for k := first; k <= last; k++ {
		d.buf[d.n] = at(k)
		d.n++
	}
	d.exp = exp - int64(nAll-nInt) + int64(nAll-1-last)
	return d, true
}

// parseExponent reads the optional exponent part at tok[i:]. huge is set
// when it has more than maxExpDigits significant digits (then exp is 0).
func parseExponent[T string | []byte](tok T, i int) (exp int64, huge bool, end int, ok bool) {
	if i >= len(tok) || (tok[i] != 'e' && tok[i] != 'E') {
		return 0, false, i, true
	}
	i++
	neg := false
	if i < len(tok) && (tok[i] == '+' || tok[i] == '-') {
		neg = tok[i] == '-'
		i++
	}
	lo := i
	if i = digitRun(tok, i); i == lo {
		return 0, false, i, false
	}
	for lo < i && tok[lo] == '0' {
		lo++
	}
	if i-lo > maxExpDigits {
		return 0, true, i, true
	}
	for k := lo; k < i; k++ {
		exp = exp*10 + int64(tok[k]-'0')
	}
	if neg {
		exp = -exp
	}
	return exp, false, i, true
}

// appendNumber writes a JSON number token in its canonical form. Every
// number is an IEEE-754 double, but a number is judged by its value, never
// by its spelling: it is refused (ErrNumber) when the value is not finite,
// when it is an integer of magnitude above 2^53 (1e16 as much as
// 10000000000000000), or when its canonical form denotes another decimal
// value than the token (9007199254740993.0 would become ...992, 0.1e-400
// would become 0). So the canonical form always denotes exactly the value
// that was sent, and canonicalizing it again gives the same bytes.
//
// The value is decided in time linear in the token: after leading and
// trailing zeros, a token with more than 17 significant digits cannot be
// what a canonical form denotes, and the rest is at most 17 digits and a
// bounded exponent, compared with the shortest round-trip digits of the
// double nearest to it. It does not allocate.
func appendNumber[T string | []byte](b []byte, tok T) ([]byte, error) {
	d, ok := parseDecimal(tok)
	switch {
	case !ok:
		return nil, ErrSyntax
	case d.tooBig:
		return nil, ErrNumber
	case d.n == 0:
		return append(b, '0'), nil // -0 and 0e999999999 included
	}
	if d.exp >= 0 && !safeInteger(d.digits(), d.exp) {
		return nil, ErrNumber
	}
	// digits "e" exp: at most 17 + 2 + 19 bytes. The conversion to string
	// does not escape, so it stays on the stack.
	var text [40]byte
	t := append(text[:0], d.digits()...)
	t = append(t, 'e')
	t = strconv.AppendInt(t, d.exp, 10)
	f, _ := strconv.ParseFloat(string(t), 64)
	if f == 0 || math.IsInf(f, 0) {
		return nil, ErrNumber // below or above the double range
	}
	if !sameValue(f, d.digits(), d.exp) {
		return nil, ErrNumber
	}
	if d.neg {
		f = -f
	}
	return AppendFloat(b, f), nil
}

// safeInteger reports whether the integer digits × 10^exp (exp ≥ 0) is at
// most 2^53.
func safeInteger(digits []byte, exp int64) bool {
	if int64(len(digits))+exp > 16 { // at least 10^16
		return false
	}
	var v uint64
	for _, c := range digits {
		v = v*10 + uint64(c-'0')
	}
	for ; exp > 0; exp-- {
		v *= 10
	}
	return v <= MaxSafeInteger
}

// sameValue reports whether the shortest round-trip decimal of the
// positive double f is exactly digits × 10^exp. Both sides are free of
// leading and trailing zeros, so equal values have equal digits and
// exponents.
func sameValue(f float64, digits []byte, exp int64) bool {
	var buf [32]byte
	d, e := shortest(&buf, f)
	return string(d) == string(digits) && int64(e-(len(d)-1)) == exp
}
