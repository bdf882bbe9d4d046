package jsonx

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/segmentio/encoding/json"
)

// Reason says why a body was refused.
type Reason string

// The reasons a body can be refused for.
const (
	ReasonSyntax        Reason = "syntax"         // not RFC 8259 JSON (incl. trailing data, empty input)
	ReasonInvalidUTF8   Reason = "invalid_utf8"   // raw bytes anywhere in the text are not valid UTF-8
	ReasonLoneSurrogate Reason = "lone_surrogate" // a \uD800-\uDFFF escape not forming a valid high+low pair
	ReasonDuplicateKey  Reason = "duplicate_key"  // an object has the same key twice (compared after unescaping)
	ReasonDepth         Reason = "depth"          // nesting deeper than MaxDepth
	ReasonNotObject     Reason = "not_object"     // DecodeObject: top-level value is not an object
	ReasonType          Reason = "type"           // DecodeObject: value does not fit the Go type (wrong field type)
)

// MaxDepth is the deepest nesting of objects and arrays that is accepted.
// A top-level object or array has depth 1.
const MaxDepth = 128

// Error is returned by Check, DecodeObject and TopLevel when a body is
// refused.
//
// Path holds the object keys (unescaped) and array indexes (as decimal
// strings) from the top level down to the place of the problem, so a
// handler can map a problem inside a specific field (e.g.
// Path[0] == "ttlSeconds") to a field-specific error code. A key is part of
// Path from the moment it has been read until its value is complete, so a
// problem in a member's value (or a missing ':' after its key) names the
// member, and for ReasonDuplicateKey the last element is the repeated key.
// Path is nil for problems at the top level and in between members.
//
// Offset is the byte offset in the input where the problem was found
// (len(input) when the input ended too early).
type Error struct {
	Reason Reason
	Path   []string
	Offset int
}

// Error returns "jsonx: <reason> at offset N". It never includes any part
// of the input (not even Path, which holds client-supplied keys).
func (e *Error) Error() string {
	return "jsonx: " + string(e.Reason) + " at offset " + strconv.Itoa(e.Offset)
}

// Check validates data as a single strict JSON value and returns nil or an
// *Error. It does not decode anything; it allocates only for the error it
// returns and, for objects with more than 16 keys, a set used to find
// duplicates.
func Check(data []byte) error {
	s := scanner{data: data}
	if _, err := s.run(); err != nil {
		return err
	}
	return nil
}

// DecodeObject checks data like Check, requires the top-level value to be
// an object (ReasonNotObject otherwise) and then decodes it into v with
// github.com/segmentio/encoding/json.
//
// A value that does not fit the Go type becomes an *Error with ReasonType;
// its Path names the offending field (JSON key names and array indexes, as
// the decoder reports them) and Offset points at the offending value.
// Any other decoding failure caused by the body, for example an error
// returned by a field's UnmarshalJSON method, is also reported as
// ReasonType, with Path nil because the decoder does not say where it
// happened. An invalid v (nil or not a pointer) yields the decoder's
// *json.InvalidUnmarshalError unchanged, because that is a programming
// error rather than a bad body.
//
// A member fills a struct field only under the field's exact name. Go's
// decoders also match names that differ in letter case, so
// {"body":"a","BODY":"b"} would decode as "b" while every other reader of
// the same bytes sees "a"; here "BODY" is an unknown member, ignored like
// any other.
func DecodeObject(data []byte, v any) error {
	start, err := checkObject(data, nil)
	if err != nil {
		return err
	}
	// checkObject refused anything after the object, so nothing is left.
	if _, err := json.Parse(data, v, json.DontMatchCaseInsensitiveStructFields); err != nil {
		return decodeError(data, start, err)
	}
	return nil
}

// TopLevel checks data like DecodeObject does (strict JSON, top-level
// object) and splits the object into its raw members without decoding
// them, so handlers can look at a field's exact token (e.g. distinguish an
// absent field from null, 1.0, 1e3 or "60").
//
// Map keys are the unescaped member names, each copied once: the map is
// also the set the top level's duplicate keys are found in. Each value is
// the member's token exactly as written, without surrounding whitespace. Values alias
// data (with their capacity capped, so appending to one never overwrites
// data); data must not be modified while the map is in use.
func TopLevel(data []byte) (map[string]json.RawMessage, error) {
	members := make(map[string]json.RawMessage)
	if _, err := checkObject(data, members); err != nil {
		return nil, err
	}
	return members, nil
}

// checkObject validates data, requires a top-level object and returns the
// offset of its opening brace. If members is non-nil it receives the raw
// top-level members.
func checkObject(data []byte, members map[string]json.RawMessage) (int, error) {
	s := scanner{data: data, top: members}
	start, err := s.run()
	if err != nil {
		return 0, err
	}
	if data[start] != '{' {
		return 0, &Error{Reason: ReasonNotObject, Offset: start}
	}
	return start, nil
}

// decodeError turns an error from json.Unmarshal of already checked data,
// whose top-level object starts at offset start, into an *Error.
func decodeError(data []byte, start int, err error) error {
	if _, ok := errors.AsType[*json.InvalidUnmarshalError](err); ok {
		return err
	}
	if typ, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if path, off, ok := resolveField(data, start, typ.Field); ok {
			return &Error{Reason: ReasonType, Path: path, Offset: off}
		}
		// The decoder's field string does not match the input (e.g. the
		// keys of a map with non-string keys were normalised); fall back
		// to splitting it.
		return &Error{Reason: ReasonType, Path: strings.Split(typ.Field, "."), Offset: start}
	}
	if syn, ok := errors.AsType[*json.SyntaxError](err); ok {
		// Cannot happen for checked input unless the decoder disagrees
		// with Check; never pass the decoder's message (which may quote
		// the input) on.
		off := int(syn.Offset)
		if off < 0 || off > len(data) {
			off = start
		}
		return &Error{Reason: ReasonSyntax, Offset: off}
	}
	return &Error{Reason: ReasonType, Offset: start}
}

// resolveField finds the value named by an UnmarshalTypeError.Field (keys
// and array indexes joined by ".") in checked data, starting at the value
// at offset i. Keys may themselves contain ".", so every member whose key
// is a prefix of field is tried. It returns the path as a list and the
// offset of the value.
func resolveField(data []byte, i int, field string) (path []string, off int, ok bool) {
	if field == "" {
		return nil, i, true
	}
	s := scanner{data: data}
	try := func(key string, at int) bool {
		rest, ok := strings.CutPrefix(field, key)
		if !ok || (rest != "" && rest[0] != '.') {
			return false
		}
		sub, o, ok := resolveField(data, at, strings.TrimPrefix(rest, "."))
		if ok {
			path, off = append([]string{key}, sub...), o
		}
		return ok
	}
	switch data[i] {
	case '{':
		i = s.ws(i + 1)
		for data[i] != '}' {
			end, esc := s.str(i)
			key := unescape(data, i+1, end-1, esc)
			i = s.ws(s.ws(end) + 1) // skip ':'
			if try(key, i) {
				return path, off, true
			}
			if i = s.ws(s.value(i, 0)); data[i] == ',' {
				i = s.ws(i + 1)
			}
		}
	case '[':
		i = s.ws(i + 1)
		for idx := 0; data[i] != ']'; idx++ {
			if try(strconv.Itoa(idx), i) {
				return path, off, true
			}
			if i = s.ws(s.value(i, 0)); data[i] == ',' {
				i = s.ws(i + 1)
			}
		}
	}
	return nil, 0, false
}

// span is the contents of a string token (without the quotes).
type span struct {
	lo, hi int
	esc    bool // contains escape sequences
}

// linearKeys is how many keys of an object are compared linearly when
// looking for duplicates; beyond that a map is used.
const linearKeys = 16

// scanner is a single-pass, recursive-descent strict JSON validator. The
// state of each open object lives in the Go stack frame of the call that
// parses it, so validation does not allocate.
//
// Parsing methods take the offset to start at and return the offset just
// past what they consumed, or -1 after recording the problem in err. While
// a -1 unwinds, each enclosing member or element appends its key or index
// to err.Path (innermost first); run reverses it.
type scanner struct {
	data []byte
	err  *Error
	// top, when not nil, receives the members of the top-level object
	// and is the set its duplicate keys are found in.
	top map[string]json.RawMessage
}

// run validates the whole input and returns the offset of the top-level
// value.
func (s *scanner) run() (int, *Error) {
	start := s.ws(0)
	i := s.value(start, 0)
	if i >= 0 {
		if i = s.ws(i); i == len(s.data) {
			return start, nil
		}
		s.unexpected(i)
	}
	slices.Reverse(s.err.Path)
	return 0, s.err
}

// fail records the problem at offset off and returns -1.
func (s *scanner) fail(r Reason, off int) int {
	s.err = &Error{Reason: r, Offset: off}
	return -1
}

// within adds one (outer) path element to the recorded problem and
// returns -1.
func (s *scanner) within(elem string) int {
	s.err.Path = append(s.err.Path, elem)
	return -1
}

// unexpected reports a byte (or the end of input) that cannot appear at
// offset i. A byte that does not start valid UTF-8 is reported as such.
func (s *scanner) unexpected(i int) int {
	if i < len(s.data) && s.data[i] >= utf8.RuneSelf {
		if r, n := utf8.DecodeRune(s.data[i:]); r == utf8.RuneError && n == 1 {
			return s.fail(ReasonInvalidUTF8, i)
		}
	}
	return s.fail(ReasonSyntax, i)
}

// ws skips JSON whitespace.
func (s *scanner) ws(i int) int {
	for i < len(s.data) {
		switch s.data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value parses one value starting exactly at i, inside depth enclosing
// objects and arrays.
func (s *scanner) value(i, depth int) int {
	if i >= len(s.data) {
		return s.fail(ReasonSyntax, i)
	}
	switch c := s.data[i]; {
	case c == '"':
		end, _ := s.str(i)
		return end
	case c == '{':
		return s.object(i, depth+1)
	case c == '[':
		return s.array(i, depth+1)
	case c == '-' || isDigit(c):
		return s.number(i)
	case c == 't':
		return s.literal(i, "true")
	case c == 'f':
		return s.literal(i, "false")
	case c == 'n':
		return s.literal(i, "null")
	default:
		return s.unexpected(i)
	}
}

func (s *scanner) literal(i int, word string) int {
	for k := 0; k < len(word); k++ {
		if i+k >= len(s.data) || s.data[i+k] != word[k] {
			return s.unexpected(i + k)
		}
	}
	return i + len(word)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number parses an RFC 8259 number:
// [ "-" ] ( "0" / [1-9] *DIGIT ) [ "." 1*DIGIT ] [ ( "e" / "E" ) [ "+" / "-" ] 1*DIGIT ]
func (s *scanner) number(i int) int {
	d := s.data
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && isDigit(d[i]):
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return s.unexpected(i)
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return s.unexpected(i)
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return s.unexpected(i)
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	return i
}

// object parses the object whose '{' is at i and which is at nesting
// level depth.
func (s *scanner) object(i, depth int) int {
	if depth > MaxDepth {
		return s.fail(ReasonDepth, i)
	}
	var (
		keys  [linearKeys]span // the first keys, for duplicate detection
		nkeys int
		set   map[string]struct{} // all keys, once there are too many
	)
	d := s.data
	i = s.ws(i + 1)
	if i < len(d) && d[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return s.unexpected(i)
		}
		keyStart := i
		end, esc := s.str(i)
		if end < 0 {
			return -1
		}
		k := span{keyStart + 1, end - 1, esc}

		dup := false
		var topKey string // the unescaped key, for a member recorded in s.top
		switch {
		case depth == 1 && s.top != nil:
			// The members map is the set: each key is copied once.
			topKey = unescape(d, k.lo, k.hi, k.esc)
			_, dup = s.top[topKey]
		case set != nil:
			key := unescapeBytes(d, k)
			if _, dup = set[string(key)]; !dup {
				set[string(key)] = struct{}{}
			}
		default:
			for _, o := range keys[:nkeys] {
				if sameKey(d, o, k) {
					dup = true
					break
				}
			}
			if dup {
				break
			}
			if nkeys < len(keys) {
				keys[nkeys] = k
				nkeys++
				break
			}
			set = make(map[string]struct{}, 2*linearKeys)
			for _, o := range keys {
				set[string(unescapeBytes(d, o))] = struct{}{}
			}
			set[string(unescapeBytes(d, k))] = struct{}{}
		}
		if dup {
			s.fail(ReasonDuplicateKey, keyStart)
			return s.within(unescape(d, k.lo, k.hi, k.esc))
		}

		i = s.ws(end)
		if i >= len(d) || d[i] != ':' {
			s.unexpected(i)
			return s.within(unescape(d, k.lo, k.hi, k.esc))
		}
		vs := s.ws(i + 1)
		if i = s.value(vs, depth); i < 0 {
			return s.within(unescape(d, k.lo, k.hi, k.esc))
		}
		if depth == 1 && s.top != nil {
			s.top[topKey] = json.RawMessage(d[vs:i:i])
		}

		i = s.ws(i)
		if i < len(d) && d[i] == ',' {
			i = s.ws(i + 1)
			continue
		}
		if i < len(d) && d[i] == '}' {
			return i + 1
		}
		return s.unexpected(i)
	}
}

// array parses the array whose '[' is at i and which is at nesting level
// depth.
func (s *scanner) array(i, depth int) int {
	if depth > MaxDepth {
		return s.fail(ReasonDepth, i)
	}
	d := s.data
	i = s.ws(i + 1)
	if i < len(d) && d[i] == ']' {
		return i + 1
	}
	for idx := 0; ; idx++ {
		if i = s.value(i, depth); i < 0 {
			return s.within(strconv.Itoa(idx))
		}
		i = s.ws(i)
		if i < len(d) && d[i] == ',' {
			i = s.ws(i + 1)
			continue
		}
		if i < len(d) && d[i] == ']' {
			return i + 1
		}
		return s.unexpected(i)
	}
}

// str parses the string whose opening quote is at i. It returns the offset
// after the closing quote (or -1) and whether the string contains escape
// sequences.
func (s *scanner) str(i int) (end int, esc bool) {
	d := s.data
	j := i + 1
	for {
		for j < len(d) && plain[d[j]] {
			j++
		}
		if j >= len(d) {
			return s.fail(ReasonSyntax, j), esc
		}
		switch c := d[j]; {
		case c == '"':
			return j + 1, esc
		case c == '\\':
			esc = true
			if j = s.escape(j); j < 0 {
				return -1, esc
			}
		case c < 0x20:
			return s.fail(ReasonSyntax, j), esc
		case c < utf8.RuneSelf:
			j++
		default:
			r, n := utf8.DecodeRune(d[j:])
			if r == utf8.RuneError && n == 1 {
				return s.fail(ReasonInvalidUTF8, j), esc
			}
			j += n
		}
	}
}

// escape validates the escape sequence whose backslash is at i and
// returns the offset after it.
func (s *scanner) escape(i int) int {
	d := s.data
	if i+1 >= len(d) {
		return s.fail(ReasonSyntax, i+1)
	}
	switch d[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2
	case 'u':
		r, bad := hex4(d, i+2)
		if bad >= 0 {
			return s.unexpected(bad)
		}
		switch {
		case isLowSurrogate(r):
			return s.fail(ReasonLoneSurrogate, i)
		case isHighSurrogate(r):
			// Must be followed immediately by a complete low surrogate
			// escape; anything else leaves this one unpaired.
			if i+7 >= len(d) || d[i+6] != '\\' || d[i+7] != 'u' {
				return s.fail(ReasonLoneSurrogate, i)
			}
			if lo, bad := hex4(d, i+8); bad >= 0 || !isLowSurrogate(lo) {
				return s.fail(ReasonLoneSurrogate, i)
			}
			return i + 12
		}
		return i + 6
	default:
		return s.unexpected(i + 1)
	}
}

// plain marks the bytes that need no attention inside a string: ASCII
// other than control characters, '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isHighSurrogate(r rune) bool { return 0xD800 <= r && r <= 0xDBFF }
func isLowSurrogate(r rune) bool  { return 0xDC00 <= r && r <= 0xDFFF }

// hex4 decodes four hex digits at d[i:]. bad is the offset of the first
// byte that is not a hex digit (len(d) if the input ends there), or -1.
func hex4(d []byte, i int) (r rune, bad int) {
	for k := i; k < i+4; k++ {
		if k >= len(d) {
			return 0, k
		}
		var v byte
		switch c := d[k]; {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, k
		}
		r = r<<4 | rune(v)
	}
	return r, -1
}

// nextRune decodes the rune at d[i] inside the contents of an already
// validated string and returns it with the offset after it.
func nextRune(d []byte, i int) (rune, int) {
	c := d[i]
	if c >= utf8.RuneSelf {
		r, n := utf8.DecodeRune(d[i:])
		return r, i + n
	}
	if c != '\\' {
		return rune(c), i + 1
	}
	switch d[i+1] {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r, _ := hex4(d, i+2)
		if isHighSurrogate(r) {
			lo, _ := hex4(d, i+8)
			return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), i + 12
		}
		return r, i + 6
	default: // '"', '\\', '/'
		return rune(d[i+1]), i + 2
	}
}

// sameKey reports whether two validated string contents are equal after
// unescaping. Both are valid UTF-8 with only valid escapes, so they are
// equal exactly when they decode to the same runes.
func sameKey(d []byte, a, b span) bool {
	if !a.esc && !b.esc {
		return bytes.Equal(d[a.lo:a.hi], d[b.lo:b.hi])
	}
	i, j := a.lo, b.lo
	for i < a.hi && j < b.hi {
		var r1, r2 rune
		r1, i = nextRune(d, i)
		r2, j = nextRune(d, j)
		if r1 != r2 {
			return false
		}
	}
	return i == a.hi && j == b.hi
}

// unescapeBytes returns the unescaped contents of a validated string. It
// returns a subslice of d when there is nothing to unescape.
func unescapeBytes(d []byte, k span) []byte {
	if !k.esc {
		return d[k.lo:k.hi]
	}
	b := make([]byte, 0, k.hi-k.lo)
	for i := k.lo; i < k.hi; {
		var r rune
		r, i = nextRune(d, i)
		b = utf8.AppendRune(b, r)
	}
	return b
}

// unescape returns the unescaped contents d[lo:hi] of a validated string.
func unescape(d []byte, lo, hi int, esc bool) string {
	return string(unescapeBytes(d, span{lo, hi, esc}))
}
