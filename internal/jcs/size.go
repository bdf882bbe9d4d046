package jcs

import "unicode/utf8"

// canonicalSize returns the length of the canonical form of raw, a JSON
// text json.Valid accepted, and refuses it (ErrNumber) for the first
// number that would be refused, in one pass over the tokens that decodes
// nothing and does not allocate. Member order does not change the length,
// so no object needs to be sorted for it.
//
// For text the caller checked (valid UTF-8, no lone surrogates) the length
// is exact; otherwise it may be lower than the length of the output, never
// higher: a byte that is not UTF-8 counts 1 and a lone surrogate escape 1,
// where the decoder writes a 3-byte U+FFFD.
func canonicalSize(raw []byte) (int, error) {
	n := 0
	var scratch [32]byte
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"':
			var size int
			size, i = stringSize(raw, i)
			n += size
		case c == '-' || isDigit(c):
			j := i + 1
			for j < len(raw) && numberByte(raw[j]) {
				j++
			}
			out, err := appendNumber(scratch[:0], raw[i:j])
			if err != nil {
				return 0, err
			}
			n += len(out)
			i = j
		default: // { } [ ] : , and the letters of true, false, null
			n++
			i++
		}
	}
	return n, nil
}

func numberByte(c byte) bool {
	return isDigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// stringSize returns the length AppendString gives the string token whose
// opening quote is at raw[i], and the offset after its closing quote.
func stringSize(raw []byte, i int) (size, end int) {
	size = 2
	j := i + 1
	for j < len(raw) {
		switch c := raw[j]; c {
		case '"':
			return size, j + 1
		case '\\':
			var n int
			n, j = escapeSize(raw, j)
			size += n
		default:
			size++
			j++
		}
	}
	return size, j
}

// escapeSize returns the length AppendString gives the character the
// escape sequence at raw[j] stands for, and the offset after the sequence.
func escapeSize(raw []byte, j int) (size, end int) {
	if j+1 >= len(raw) {
		return 0, len(raw)
	}
	switch raw[j+1] {
	case '/':
		return 1, j + 2
	case 'u':
	default: // " \ b f n r t keep a two-byte escape
		return 2, j + 2
	}
	r, ok := hex4(raw, j+2)
	switch {
	case !ok:
		return 0, len(raw)
	case 0xD800 <= r && r <= 0xDBFF:
		if lo, ok := hex4(raw, j+8); ok && j+7 < len(raw) && raw[j+6] == '\\' && raw[j+7] == 'u' && 0xDC00 <= lo && lo <= 0xDFFF {
			return 4, j + 12
		}
		return 1, j + 6
	case 0xDC00 <= r && r <= 0xDFFF:
		return 1, j + 6
	case r == '"' || r == '\\' || r == '\b' || r == '\t' || r == '\n' || r == '\f' || r == '\r':
		return 2, j + 6
	case r < 0x20:
		return 6, j + 6 // \u00xx
	}
	return utf8.RuneLen(r), j + 6
}

// hex4 decodes the four hex digits at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case isDigit(c):
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
