package jsonx

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkCase is one Check input. reason == "" means the input is valid.
// offset < 0 means the offset is not asserted.
type checkCase struct {
	name   string
	in     string
	reason Reason
	path   []string
	offset int
}

func nested(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

func repeatPath(elem string, n int) []string {
	p := make([]string, n)
	for i := range p {
		p[i] = elem
	}
	return p
}

// manyKeys returns an object with keys k0..k(n-1) followed by extra
// members, to exercise the map mode of duplicate detection.
func manyKeys(n int, extra string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	b.WriteString(extra)
	b.WriteString("}")
	return b.String()
}

var validCases = []checkCase{
	{name: "empty object", in: `{}`},
	{name: "empty array", in: `[]`},
	{name: "whitespace around", in: " \t\r\n{ \"a\" : [ 1 , 2 ] }\n\t "},
	{name: "nested empty", in: `{"a":{},"b":[],"c":[{}],"d":[[]]}`},
	{name: "nested arrays", in: `[[[1,[2,[3,{"x":[[]]}]]]]]`},
	{name: "scalars true", in: `true`},
	{name: "scalars false", in: `false`},
	{name: "scalars null", in: `null`},
	{name: "string", in: `"hello"`},
	{name: "zero", in: `0`},
	{name: "negative zero", in: `-0`},
	{name: "fraction exponent", in: `-0.0e-0`},
	{name: "exponent plus", in: `1E+2`},
	{name: "big exponent", in: `1e400`},
	{name: "tiny exponent", in: `-1e-400`},
	{name: "big integer", in: `123456789012345678901234567890123456789`},
	{name: "long fraction", in: `3.14159265358979323846264338327950288419716939937510`},
	{name: "escaped pair", in: `"\ud83d\ude00"`},
	{name: "escaped pair upper", in: `"\uD83D\uDE00"`},
	{name: "min pair", in: `"\ud800\udc00"`},
	{name: "max pair", in: `"\udbff\udfff"`},
	{name: "escaped nul", in: `"\u0000"`},
	{name: "escaped BMP edge", in: `"\ud7ff\ue000\uffff\ufffd"`},
	{name: "simple escapes", in: `"\"\\\/\b\f\n\r\t"`},
	{name: "raw UTF-8", in: `{"café":"日本語 😀","ü":"\u00fc"}`},
	{name: "raw U+FFFD", in: "\"\xef\xbf\xbd\""},
	{name: "raw max rune", in: "\"\xf4\x8f\xbf\xbf\""},
	{name: "DEL is not a control char", in: "\"\x7f\""},
	{name: "keys differ in case", in: `{"a":1,"A":2}`},
	{name: "same key in different objects", in: `{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`},
	{name: "keys differ after nul", in: `{"a\u0000":1,"a":2}`},
	{name: "escaped key prefix differs", in: `{"ab":1,"a\u0062c":2,"\u0061":3}`},
	{name: "pair key vs other pair", in: `{"\ud83d\ude00":1,"\ud83d\ude01":2}`},
	{name: "depth 128 arrays", in: nested("[", "]", MaxDepth)},
	{name: "depth 128 objects", in: strings.Repeat(`{"a":`, MaxDepth-1) + "{}" + strings.Repeat("}", MaxDepth-1)},
	{name: "many distinct keys", in: manyKeys(40, `,"\u006b40":40`)},
	{name: "exactly linear keys", in: manyKeys(linearKeys, "")},
	{name: "chat message", in: chatBody()},
}

var invalidCases = []checkCase{
	// syntax
	{name: "empty input", in: ``, reason: ReasonSyntax, offset: 0},
	{name: "only whitespace", in: " \n\t", reason: ReasonSyntax, offset: 3},
	{name: "unclosed object", in: `{`, reason: ReasonSyntax, offset: 1},
	{name: "key without colon at eof", in: `{"a"`, reason: ReasonSyntax, path: []string{"a"}, offset: 4},
	{name: "key without colon", in: `{"a" 1}`, reason: ReasonSyntax, path: []string{"a"}, offset: 5},
	{name: "missing value eof", in: `{"a":`, reason: ReasonSyntax, path: []string{"a"}, offset: 5},
	{name: "missing value", in: `{"a":}`, reason: ReasonSyntax, path: []string{"a"}, offset: 5},
	{name: "trailing comma object", in: `{"a":1,}`, reason: ReasonSyntax, offset: 7},
	{name: "missing comma object", in: `{"a":1 "b":2}`, reason: ReasonSyntax, offset: 7},
	{name: "leading comma object", in: `{,}`, reason: ReasonSyntax, offset: 1},
	{name: "unquoted key", in: `{a:1}`, reason: ReasonSyntax, offset: 1},
	{name: "single quotes", in: `{'a':1}`, reason: ReasonSyntax, offset: 1},
	{name: "trailing comma array", in: `[1,]`, reason: ReasonSyntax, path: []string{"1"}, offset: 3},
	{name: "missing comma array", in: `[1 2]`, reason: ReasonSyntax, offset: 3},
	{name: "unclosed array", in: `[1,2`, reason: ReasonSyntax, offset: 4},
	{name: "mismatched close", in: `[1}`, reason: ReasonSyntax, offset: 2},
	{name: "trailing data", in: `{"a":1}x`, reason: ReasonSyntax, offset: 7},
	{name: "extra close", in: `{"a":1}}`, reason: ReasonSyntax, offset: 7},
	{name: "two values", in: `{} {}`, reason: ReasonSyntax, offset: 3},
	{name: "trailing nul", in: "{}\x00", reason: ReasonSyntax, offset: 2},
	{name: "BOM", in: "\xef\xbb\xbf{}", reason: ReasonSyntax, offset: 0},
	{name: "leading zero", in: `01`, reason: ReasonSyntax, offset: 1},
	{name: "leading zero negative", in: `-01`, reason: ReasonSyntax, offset: 2},
	{name: "lone minus", in: `-`, reason: ReasonSyntax, offset: 1},
	{name: "plus", in: `+1`, reason: ReasonSyntax, offset: 0},
	{name: "leading dot", in: `.5`, reason: ReasonSyntax, offset: 0},
	{name: "trailing dot", in: `1.`, reason: ReasonSyntax, offset: 2},
	{name: "dot exponent", in: `1.e5`, reason: ReasonSyntax, offset: 2},
	{name: "empty exponent", in: `1e`, reason: ReasonSyntax, offset: 2},
	{name: "empty signed exponent", in: `1e+`, reason: ReasonSyntax, offset: 3},
	{name: "hex number", in: `0x10`, reason: ReasonSyntax, offset: 1},
	{name: "NaN", in: `NaN`, reason: ReasonSyntax, offset: 0},
	{name: "Infinity", in: `Infinity`, reason: ReasonSyntax, offset: 0},
	{name: "minus Infinity", in: `-Infinity`, reason: ReasonSyntax, offset: 1},
	{name: "number in object", in: `{"n":-}`, reason: ReasonSyntax, path: []string{"n"}, offset: 6},
	{name: "truncated true", in: `tru`, reason: ReasonSyntax, offset: 3},
	{name: "capital True", in: `True`, reason: ReasonSyntax, offset: 0},
	{name: "misspelled null", in: `nul1`, reason: ReasonSyntax, offset: 3},
	{name: "unterminated string", in: `"abc`, reason: ReasonSyntax, offset: 4},
	{name: "raw control char", in: "\"a\x01\"", reason: ReasonSyntax, offset: 2},
	{name: "raw newline", in: "{\"t\":\"a\nb\"}", reason: ReasonSyntax, path: []string{"t"}, offset: 7},
	{name: "raw nul", in: "\"\x00\"", reason: ReasonSyntax, offset: 1},
	{name: "bad escape", in: `"\a"`, reason: ReasonSyntax, offset: 2},
	{name: "escaped quote single", in: `"\'"`, reason: ReasonSyntax, offset: 2},
	{name: "short unicode escape", in: `"\u12"`, reason: ReasonSyntax, offset: 5},
	{name: "bad hex", in: `"\u12G4"`, reason: ReasonSyntax, offset: 5},
	{name: "backslash at eof", in: `"\`, reason: ReasonSyntax, offset: 2},
	{name: "deep syntax", in: `{"a":[1,2,{"b":tru}]}`, reason: ReasonSyntax, path: []string{"a", "2", "b"}, offset: 18},
	{name: "comment", in: `{"a":1 /* c */}`, reason: ReasonSyntax, offset: 7},

	// invalid UTF-8
	{name: "bad byte in string", in: "\"\xff\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "bad continuation", in: "{\"a\":\"\xc3\x28\"}", reason: ReasonInvalidUTF8, path: []string{"a"}, offset: 6},
	{name: "overlong slash", in: "\"\xc0\xaf\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "overlong 3 byte", in: "\"\xe0\x80\xaf\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "encoded surrogate", in: "\"\xed\xa0\x80\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "above max rune", in: "\"\xf4\x90\x80\x80\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "truncated sequence", in: "\"\xe2\x82\"", reason: ReasonInvalidUTF8, offset: 1},
	{name: "truncated at eof", in: "\"\xe2\x82", reason: ReasonInvalidUTF8, offset: 1},
	{name: "in key", in: "{\"\xff\":1}", reason: ReasonInvalidUTF8, offset: 2},
	{name: "top level byte", in: "\xff", reason: ReasonInvalidUTF8, offset: 0},
	{name: "after value", in: "{\"a\":1}\xfe", reason: ReasonInvalidUTF8, offset: 7},
	{name: "as array element", in: "[1,\xfe]", reason: ReasonInvalidUTF8, path: []string{"1"}, offset: 3},
	{name: "deep in array", in: "[[\"ok\",\"\x80\"]]", reason: ReasonInvalidUTF8, path: []string{"0", "1"}, offset: 8},

	// lone surrogates
	{name: "lone high", in: `"\ud800"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "lone low", in: `"\udc00"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "lone high upper", in: `"\uDBFF"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high then char", in: `"\ud800x"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high then BMP escape", in: `"\ud800\u0041"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high then high", in: `"\ud800\ud800"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "low then high", in: `"\udc00\ud800"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high then other escape", in: `"\ud800\n"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high then broken escape", in: `"\ud800\u12"`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "high at eof", in: `"\ud800`, reason: ReasonLoneSurrogate, offset: 1},
	{name: "pair then lone low", in: `"\ud83d\ude00\ude00"`, reason: ReasonLoneSurrogate, offset: 13},
	{name: "nested", in: `{"a":{"b":"\ud800"}}`, reason: ReasonLoneSurrogate, path: []string{"a", "b"}, offset: 11},
	{name: "in array", in: `["ok","\uDBFF"]`, reason: ReasonLoneSurrogate, path: []string{"1"}, offset: 7},
	{name: "in key", in: `{"\ud800":1}`, reason: ReasonLoneSurrogate, offset: 2},
	{name: "escaped backslash is not an escape", in: `["\\ud800", "\\\ud800"]`, reason: ReasonLoneSurrogate, path: []string{"1"}, offset: 15},

	// duplicate keys
	{name: "duplicate", in: `{"x":1,"x":2}`, reason: ReasonDuplicateKey, path: []string{"x"}, offset: 7},
	{name: "duplicate escaped", in: `{"a":1,"\u0061":2}`, reason: ReasonDuplicateKey, path: []string{"a"}, offset: 7},
	{name: "duplicate both escaped", in: `{"\u0061":1,"\u0061":2}`, reason: ReasonDuplicateKey, path: []string{"a"}, offset: 12},
	{name: "duplicate escaped slash", in: `{"a/b":1,"a\/b":2}`, reason: ReasonDuplicateKey, path: []string{"a/b"}, offset: 9},
	{name: "duplicate raw vs escaped", in: `{"é":1,"\u00e9":2}`, reason: ReasonDuplicateKey, path: []string{"é"}, offset: 8},
	{name: "duplicate emoji pair", in: `{"😀":1,"\ud83d\ude00":2}`, reason: ReasonDuplicateKey, path: []string{"😀"}, offset: 10},
	{name: "duplicate empty key", in: `{"":1,"":2}`, reason: ReasonDuplicateKey, path: []string{""}, offset: 6},
	{name: "duplicate not adjacent", in: `{"x":1,"y":2,"x":3}`, reason: ReasonDuplicateKey, path: []string{"x"}, offset: 13},
	{name: "duplicate nested", in: `{"a":{"b":1,"b":2}}`, reason: ReasonDuplicateKey, path: []string{"a", "b"}, offset: 12},
	{name: "duplicate in array", in: `[{},{"k":1,"k":1}]`, reason: ReasonDuplicateKey, path: []string{"1", "k"}, offset: 11},
	{name: "duplicate after nested value", in: `{"a":{"x":{}},"a":1}`, reason: ReasonDuplicateKey, path: []string{"a"}, offset: 14},
	{name: "duplicate in map mode", in: manyKeys(30, `,"k3":3`), reason: ReasonDuplicateKey, path: []string{"k3"}, offset: -1},
	{name: "duplicate escaped in map mode", in: manyKeys(30, `,"\u006b29":3`), reason: ReasonDuplicateKey, path: []string{"k29"}, offset: -1},
	{name: "duplicate triggers map mode", in: manyKeys(linearKeys, `,"k0":0`), reason: ReasonDuplicateKey, path: []string{"k0"}, offset: -1},

	// depth
	{name: "depth 129 arrays", in: nested("[", "]", MaxDepth+1), reason: ReasonDepth, path: repeatPath("0", MaxDepth), offset: MaxDepth},
	{name: "depth 129 objects", in: strings.Repeat(`{"a":`, MaxDepth) + "{}" + strings.Repeat("}", MaxDepth), reason: ReasonDepth, path: repeatPath("a", MaxDepth), offset: 5 * MaxDepth},
	{name: "depth unclosed", in: strings.Repeat("[", 10000), reason: ReasonDepth, path: repeatPath("0", MaxDepth), offset: MaxDepth},
}

func TestCheck(t *testing.T) {
	for _, tc := range slices.Concat(validCases, invalidCases) {
		t.Run(tc.name, func(t *testing.T) {
			assertCheck(t, Check([]byte(tc.in)), tc)
		})
	}
}

func assertCheck(t *testing.T, err error, tc checkCase) {
	t.Helper()
	if tc.reason == "" {
		if err != nil {
			t.Fatalf("Check(%q) = %v (%#v), want nil", tc.in, err, err)
		}
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Check(%q) = %#v, want *Error", tc.in, err)
	}
	if e.Reason != tc.reason {
		t.Errorf("Check(%q).Reason = %q, want %q (offset %d)", tc.in, e.Reason, tc.reason, e.Offset)
	}
	if !slices.Equal(e.Path, tc.path) {
		t.Errorf("Check(%q).Path = %q, want %q", tc.in, e.Path, tc.path)
	}
	if tc.offset >= 0 && e.Offset != tc.offset {
		t.Errorf("Check(%q).Offset = %d, want %d", tc.in, e.Offset, tc.offset)
	}
}

func TestErrorMessage(t *testing.T) {
	err := Check([]byte(`{"secret-token\ud800":1}`))
	if got, want := err.Error(), "jsonx: lone_surrogate at offset 14"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	err = Check([]byte(`{"password":"hunter2","password":"x"}`))
	if got, want := err.Error(), "jsonx: duplicate_key at offset 22"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestCheckDoesNotAllocate(t *testing.T) {
	data := []byte(chatBody())
	if n := testing.AllocsPerRun(100, func() {
		if Check(data) != nil {
			t.Fatal("chat body refused")
		}
	}); n != 0 {
		t.Errorf("Check allocates %v times per call on a valid body, want 0", n)
	}
}

type ttlRequest struct {
	Conversation string   `json:"conversationId"`
	TTL          int      `json:"ttlSeconds"`
	Tags         []string `json:"tags"`
	Inner        struct {
		N int `json:"n"`
	} `json:"inner"`
	Limits map[string]int `json:"limits"`
}

type failingField struct{}

func (*failingField) UnmarshalJSON([]byte) error { return errors.New("no") }

func TestDecodeObject(t *testing.T) {
	var req ttlRequest
	in := `{"conversationId":"c1","ttlSeconds":60,"tags":["a","b"],"inner":{"n":2},"limits":{"x.y":3}}`
	if err := DecodeObject([]byte(in), &req); err != nil {
		t.Fatalf("DecodeObject(valid) = %v", err)
	}
	if req.Conversation != "c1" || req.TTL != 60 || len(req.Tags) != 2 || req.Inner.N != 2 || req.Limits["x.y"] != 3 {
		t.Errorf("DecodeObject decoded %+v", req)
	}

	cases := []checkCase{
		{name: "string for int", in: `{"ttlSeconds":"60"}`, reason: ReasonType, path: []string{"ttlSeconds"}, offset: 14},
		{name: "fraction for int", in: `{"conversationId":"c","ttlSeconds":1.5}`, reason: ReasonType, path: []string{"ttlSeconds"}, offset: 35},
		{name: "overflow for int", in: `{"ttlSeconds":1e400}`, reason: ReasonType, path: []string{"ttlSeconds"}, offset: 14},
		{name: "object for string", in: `{"conversationId":{}}`, reason: ReasonType, path: []string{"conversationId"}, offset: 18},
		{name: "array element", in: `{"tags":["a", 1]}`, reason: ReasonType, path: []string{"tags", "1"}, offset: 14},
		{name: "nested field", in: `{"inner":{"n":true}}`, reason: ReasonType, path: []string{"inner", "n"}, offset: 14},
		{name: "map key with dot", in: `{"limits":{"a":1,"x.y":"z"}}`, reason: ReasonType, path: []string{"limits", "x.y"}, offset: 23},
		{name: "not object array", in: ` [1]`, reason: ReasonNotObject, offset: 1},
		{name: "not object null", in: `null`, reason: ReasonNotObject, offset: 0},
		{name: "not object string", in: `"{}"`, reason: ReasonNotObject, offset: 0},
		{name: "check first", in: `[1,`, reason: ReasonSyntax, path: []string{"1"}, offset: 3},
		{name: "duplicate before type", in: `{"ttlSeconds":"x","ttlSeconds":1}`, reason: ReasonDuplicateKey, path: []string{"ttlSeconds"}, offset: 18},
		{name: "lone surrogate in field", in: `{"conversationId":"\udfff"}`, reason: ReasonLoneSurrogate, path: []string{"conversationId"}, offset: 19},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req ttlRequest
			assertCheck(t, DecodeObject([]byte(tc.in), &req), tc)
		})
	}

	// A member fills a field only under its exact name: a case variant is
	// an unknown member, so it neither overrides the field nor fails the
	// decode for its type.
	t.Run("case variant ignored", func(t *testing.T) {
		var req ttlRequest
		if err := DecodeObject([]byte(`{"ttlSeconds":60,"TTLSECONDS":7,"ConversationID":"x","conversationId":"c","TtlSeconds":true}`), &req); err != nil {
			t.Fatalf("DecodeObject = %v", err)
		}
		if req.TTL != 60 || req.Conversation != "c" {
			t.Fatalf("decoded %+v, want the exact names' values (60, c)", req)
		}
		req = ttlRequest{}
		if err := DecodeObject([]byte(`{"TTLSECONDS":5}`), &req); err != nil || req.TTL != 0 {
			t.Fatalf("a case variant alone filled the field: %+v %v", req, err)
		}
	})

	t.Run("unmarshaler error", func(t *testing.T) {
		var v struct {
			F failingField `json:"f"`
		}
		err := DecodeObject([]byte(`{"f":1}`), &v)
		var e *Error
		if !errors.As(err, &e) || e.Reason != ReasonType {
			t.Fatalf("DecodeObject = %#v, want ReasonType", err)
		}
	})

	t.Run("non-pointer target", func(t *testing.T) {
		var req ttlRequest
		err := DecodeObject([]byte(`{}`), req)
		var e *Error
		if err == nil || errors.As(err, &e) {
			t.Fatalf("DecodeObject(non-pointer) = %#v, want a non-*Error error", err)
		}
	})
}

func TestTopLevel(t *testing.T) {
	in := " {\"ttl\" : 1e3 ,\"n\":null,\"s\":\"60\",\"f\":1.0, \"\\u006Fbj\":{\"a\":[1, 2]}}\n"
	m, err := TopLevel([]byte(in))
	if err != nil {
		t.Fatalf("TopLevel = %v", err)
	}
	want := map[string]string{"ttl": `1e3`, "n": `null`, "s": `"60"`, "f": `1.0`, "obj": `{"a":[1, 2]}`}
	if len(m) != len(want) {
		t.Errorf("TopLevel returned %d members, want %d: %q", len(m), len(want), m)
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok || string(got) != v {
			t.Errorf("TopLevel[%q] = %q (present %v), want %q", k, got, ok, v)
		}
		if cap(got) != len(got) {
			t.Errorf("TopLevel[%q] has spare capacity", k)
		}
	}
	if _, ok := m["absent"]; ok {
		t.Error("absent key present")
	}

	for _, tc := range []checkCase{
		{name: "not object", in: `[]`, reason: ReasonNotObject, offset: 0},
		{name: "duplicate", in: `{"ttl":1,"ttl":2}`, reason: ReasonDuplicateKey, path: []string{"ttl"}, offset: 9},
		{name: "trailing", in: `{"ttl":1},`, reason: ReasonSyntax, offset: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := TopLevel([]byte(tc.in))
			if m != nil {
				t.Errorf("TopLevel returned a map with an error")
			}
			assertCheck(t, err, tc)
		})
	}
}

// TopLevel keeps one copy of each top-level key (the map's), which is also
// the set its duplicates are found in: about one allocation per member,
// plus the map's growth, however many members a body has.
func TestTopLevelCopiesEachKeyOnce(t *testing.T) {
	const n = 1000
	var b strings.Builder
	b.WriteString(`{"count":1`)
	for i := range n {
		b.WriteString(`,"key` + strconv.Itoa(i) + `":0`)
	}
	b.WriteString(`}`)
	data := []byte(b.String())
	allocs := testing.AllocsPerRun(5, func() {
		if m, err := TopLevel(data); err != nil || len(m) != n+1 {
			t.Fatalf("TopLevel = %d members, %v", len(m), err)
		}
	})
	if allocs > 1.2*n {
		t.Errorf("TopLevel of %d members allocates %v times, want about one per member", n+1, allocs)
	}
}

// reference reports whether data is acceptable according to an
// implementation built from encoding/json and independent helpers.
func reference(data []byte) bool {
	if !stdjson.Valid(data) || !utf8.Valid(data) || refLoneSurrogate(data) {
		return false
	}
	dup, depth := refDuplicatesAndDepth(data)
	return !dup && depth <= MaxDepth
}

// refLoneSurrogate reports whether json.Valid data contains an unpaired
// surrogate escape.
func refLoneSurrogate(data []byte) bool {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if data[i+1] != 'u' {
				i++
				continue
			}
			u, _ := strconv.ParseUint(string(data[i+2:i+6]), 16, 32)
			switch {
			case u >= 0xDC00 && u <= 0xDFFF:
				return true
			case u >= 0xD800 && u <= 0xDBFF:
				if i+12 > len(data) || string(data[i+6:i+8]) != `\u` {
					return true
				}
				l, err := strconv.ParseUint(string(data[i+8:i+12]), 16, 32)
				if err != nil || l < 0xDC00 || l > 0xDFFF {
					return true
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return false
}

// refDuplicatesAndDepth walks valid JSON with encoding/json's tokenizer.
func refDuplicatesAndDepth(data []byte) (dup bool, maxDepth int) {
	type frame struct {
		obj       bool
		expectKey bool
		keys      map[string]bool
	}
	var stack []*frame
	dec := stdjson.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].expectKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false, maxDepth
		}
		if err != nil {
			panic(fmt.Sprintf("reference tokenizer on valid input %q: %v", data, err))
		}
		switch tok := tok.(type) {
		case stdjson.Delim:
			switch tok {
			case '{', '[':
				stack = append(stack, &frame{obj: tok == '{', expectKey: true, keys: map[string]bool{}})
				maxDepth = max(maxDepth, len(stack))
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].expectKey {
				top := stack[n-1]
				if top.keys[tok] {
					return true, maxDepth
				}
				top.keys[tok] = true
				top.expectKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

// assertAgainstReference checks the properties shared by the corpus test
// and the fuzzer.
func assertAgainstReference(t *testing.T, data []byte) {
	t.Helper()
	err := Check(data)
	valid, validUTF8 := stdjson.Valid(data), utf8.Valid(data)
	if err == nil {
		if !valid || !validUTF8 {
			t.Fatalf("Check(%q) = nil, but json.Valid=%v utf8.Valid=%v", data, valid, validUTF8)
		}
	}
	if valid {
		if got, want := err == nil, reference(data); got != want {
			t.Fatalf("Check(%q) = %v, reference acceptance = %v", data, err, want)
		}
	}
	if err == nil {
		assertTopLevel(t, data)
		return
	}
	e, ok := err.(*Error)
	if !ok {
		t.Fatalf("Check(%q) returned %T, want *Error", data, err)
	}
	if e.Offset < 0 || e.Offset > len(data) {
		t.Fatalf("Check(%q).Offset = %d out of range", data, e.Offset)
	}
	switch e.Reason {
	case ReasonSyntax:
		if valid {
			t.Fatalf("Check(%q) = syntax error at %d, but json.Valid is true", data, e.Offset)
		}
	case ReasonInvalidUTF8:
		if validUTF8 {
			t.Fatalf("Check(%q) = invalid_utf8 at %d, but utf8.Valid is true", data, e.Offset)
		}
		if r, n := utf8.DecodeRune(data[e.Offset:]); r != utf8.RuneError || n != 1 {
			t.Fatalf("Check(%q) = invalid_utf8 at %d, but a valid rune starts there", data, e.Offset)
		}
	case ReasonLoneSurrogate:
		if !bytes.HasPrefix(data[e.Offset:], []byte(`\u`)) {
			t.Fatalf("Check(%q) = lone_surrogate at %d, which is not an escape", data, e.Offset)
		}
	case ReasonDuplicateKey:
		if data[e.Offset] != '"' || len(e.Path) == 0 {
			t.Fatalf("Check(%q) = duplicate_key at %d with path %q", data, e.Offset, e.Path)
		}
	case ReasonDepth:
		if c := data[e.Offset]; (c != '[' && c != '{') || len(e.Path) != MaxDepth {
			t.Fatalf("Check(%q) = depth at %d with %d path elements", data, e.Offset, len(e.Path))
		}
	default:
		t.Fatalf("Check(%q) returned reason %q", data, e.Reason)
	}
	if want := "jsonx: " + string(e.Reason) + " at offset " + strconv.Itoa(e.Offset); e.Error() != want {
		t.Fatalf("Error() = %q, want %q", e.Error(), want)
	}
	m, err2 := TopLevel(data)
	if e2, ok := err2.(*Error); m != nil || !ok || e2.Reason != e.Reason || e2.Offset != e.Offset || !slices.Equal(e2.Path, e.Path) {
		t.Fatalf("TopLevel(%q) = %v, %#v; Check = %#v", data, m, err2, err)
	}
}

// assertTopLevel compares TopLevel and DecodeObject on checked data with
// encoding/json.
func assertTopLevel(t *testing.T, data []byte) {
	t.Helper()
	m, err := TopLevel(data)
	var std map[string]stdjson.RawMessage
	if stdErr := stdjson.Unmarshal(data, &std); stdErr != nil || std == nil {
		var e *Error
		if !errors.As(err, &e) || e.Reason != ReasonNotObject {
			t.Fatalf("TopLevel(%q) = %v, want not_object", data, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("TopLevel(%q) = %v", data, err)
	}
	if len(m) != len(std) {
		t.Fatalf("TopLevel(%q) has %d members, encoding/json %d", data, len(m), len(std))
	}
	for k, v := range std {
		if !bytes.Equal(m[k], v) {
			t.Fatalf("TopLevel(%q)[%q] = %q, encoding/json %q", data, k, m[k], v)
		}
	}
	var dst map[string]any
	if err := DecodeObject(data, &dst); err != nil {
		if e, ok := err.(*Error); !ok || e.Reason != ReasonType {
			t.Fatalf("DecodeObject(%q, map) = %#v, want nil or ReasonType", data, err)
		}
	}
}

// corpus returns the table inputs plus deterministic truncations and
// mutations of them.
func corpus() [][]byte {
	var out [][]byte
	for _, tc := range slices.Concat(validCases, invalidCases) {
		out = append(out, []byte(tc.in))
	}
	for _, tc := range validCases {
		if len(tc.in) > 200 {
			continue
		}
		for i := range len(tc.in) {
			out = append(out, []byte(tc.in[:i]))
		}
	}
	pieces := []string{
		"{", "}", "[", "]", `"`, ":", ",", `\`, "u", "d8", "dc", "00", "0", "1", "-",
		"+", ".", "e", " ", "\n", "a", "\x00", "\x1f", "\x7f", "\xff", "\xc3", "\xa9",
		"\xed\xa0\x80", `\ud800`, `\udc00`, `\ud83d\ude00`, `"a":1`, `"a"`, "null", "tru",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seeds := out[:len(validCases)+len(invalidCases)]
	for range 20000 {
		b := []byte(string(seeds[rng.IntN(len(seeds))]))
		if len(b) > 400 {
			continue
		}
		for range 1 + rng.IntN(3) {
			p := []byte(pieces[rng.IntN(len(pieces))])
			at := rng.IntN(len(b) + 1)
			switch rng.IntN(3) {
			case 0: // insert
				b = slices.Insert(b, at, p...)
			case 1: // delete
				if at < len(b) {
					b = slices.Delete(b, at, min(len(b), at+1+rng.IntN(3)))
				}
			default: // replace
				if at < len(b) {
					b = slices.Replace(b, at, min(len(b), at+len(p)), p...)
				}
			}
		}
		out = append(out, b)
	}
	return out
}

func TestAgainstEncodingJSON(t *testing.T) {
	accepted, valid := 0, 0
	for _, data := range corpus() {
		assertAgainstReference(t, data)
		if stdjson.Valid(data) {
			valid++
			if Check(data) == nil {
				accepted++
			}
		}
	}
	if valid < 1000 || accepted < 500 {
		t.Errorf("weak corpus: %d json.Valid inputs, %d accepted", valid, accepted)
	}
	t.Logf("%d json.Valid inputs, %d accepted by Check", valid, accepted)
}

func FuzzCheck(f *testing.F) {
	for _, tc := range slices.Concat(validCases, invalidCases) {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		assertAgainstReference(t, data)
	})
}

// chatBody returns a realistic ~4 KiB chat message request body.
func chatBody() string {
	text := "Hey team 👋 — quick update on the release: the new websocket gateway is live in eu-central, " +
		"latency p99 dropped from 180ms to 95ms. Danke @jürgen für den Review! " +
		"Remaining: \\\"presence\\\" fan-out and the 日本語 locale strings. Emoji check: \\ud83d\\ude80\\ud83c\\udf89\\n" +
		"Details: https://wiki.example.com/gateway/rollout?stage=2&region=eu\\/central\\n"
	var b strings.Builder
	b.WriteString(`{"conversationId":"c_01HZX3K9Q7R2M4N6P8T0V2W4Y6","clientMessageId":"6f1c2b9e-3d4a-4b8f-9e2a-7c5d1f0a3b6e",`)
	b.WriteString(`"type":"text","text":"`)
	for b.Len() < 2600 {
		b.WriteString(text)
	}
	b.WriteString(`","format":{"markdown":true,"spans":[{"start":0,"end":8,"style":"bold"},{"start":97,"end":104,"style":"mention","userId":"u_8842"}]},`)
	b.WriteString(`"mentions":[{"userId":"u_8842","display":"Jürgen Weiß","offset":97,"length":7},{"userId":"u_1203","display":"Aiko 田中","offset":140,"length":5}],`)
	b.WriteString(`"attachments":[{"id":"att_9f8e7d","kind":"image","mime":"image/png","name":"latency-p99.png","size":184223,"width":1280,"height":720,` +
		`"sha256":"3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b","thumbnail":{"width":320,"height":180,"blurhash":"LEHV6nWB2yk8pyo0adR*.7kCMdnj"}},` +
		`{"id":"att_1a2b3c","kind":"file","mime":"application/pdf","name":"rollout-plan-v3.pdf","size":48213,"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}],`)
	b.WriteString(`"replyTo":{"messageId":"m_01HZX2Z8","preview":"Can we ship the gateway before Friday?"},"ttlSeconds":86400,"silent":false,"priority":2,` +
		`"client":{"platform":"ios","version":"5.12.0","build":51200,"locale":"de-DE","tz":"Europe/Berlin","sentAt":"2024-05-14T09:31:07.123Z","seq":1042,"clockSkewMs":-12.5}}`)
	return b.String()
}

func BenchmarkCheck(b *testing.B) {
	data := []byte(chatBody())
	if len(data) < 3500 || len(data) > 4700 {
		b.Fatalf("chat body is %d bytes, want about 4 KiB", len(data))
	}
	if err := Check(data); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if Check(data) != nil {
			b.Fatal("refused")
		}
	}
}
