// Package ids generates and validates UUIDs (RFC 9562). New ids are version 7
// (time-ordered, so primary-key indexes stay append-mostly). Safe for
// concurrent use.
package ids

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// New returns a random, time-ordered UUIDv7 in canonical lower-case form.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	ms := uint64(time.Now().UnixMilli())
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms)
	copy(b[0:6], ts[2:8])
	b[6] = (b[6] & 0x0f) | 0x70
	b[8] = (b[8] & 0x3f) | 0x80
	return format(b)
}

func format(b [16]byte) string {
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], b[10:16])
	return string(out[:])
}

// Canonical parses a UUID in the 8-4-4-4-12 hex form (either case) and
// returns it in lower case; ok is false for anything else.
func Canonical(s string) (string, bool) {
	b, ok := Parse(s)
	if !ok {
		return "", false
	}
	return format(b), true
}

// Parse parses a UUID in the 8-4-4-4-12 hex form (either case) into its 16
// bytes; ok is false for anything else.
func Parse(s string) (b [16]byte, ok bool) {
	if len(s) != 36 {
		return b, false
	}
	j := 0
	for i := 0; i < 36; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if s[i] != '-' {
				return [16]byte{}, false
			}
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return [16]byte{}, false
		}
		b[j] = hi<<4 | lo
		j++
		i += 2
	}
	return b, true
}

// Valid reports whether s is a UUID.
func Valid(s string) bool {
	_, ok := Canonical(s)
	return ok
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
