package jcs_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/jcs"
	"github.com/han-app/gateway/internal/jsonx"
)

// RFC 8785 Appendix B: IEEE-754 bit patterns and their canonical text.
func TestNumbersRFC8785AppendixB(t *testing.T) {
	for _, c := range []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	} {
		f := math.Float64frombits(c.bits)
		if got := string(jcs.AppendFloat(nil, f)); got != c.want {
			t.Errorf("%#016x: got %s, want %s", c.bits, got, c.want)
		}
		// The same value written as a JSON number token canonicalizes
		// the same way, unless it is an integer above 2^53: that is
		// refused however it is spelled.
		tok := strconv.FormatFloat(f, 'e', -1, 64)
		got, err := canonicalize([]byte(tok))
		if math.Abs(f) > jcs.MaxSafeInteger && f == math.Trunc(f) {
			if err != jcs.ErrNumber {
				t.Errorf("token %s: got %s (%v), want ErrNumber", tok, got, err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("token %s: got %s (%v), want %s", tok, got, err, c.want)
		}
	}
}

// The examples of RFC 8785 section 3.2.2 and the sorting example of
// section 3.2.3. The first example's numbers 333333333.33333329 (a double
// cannot hold it: it would become 333333333.3333333) and 1E30 (an integer
// above 2^53) are refused, so they are replaced by 333333333.3333333 and
// 1E-30 here; TestCanonicalizeNumberValues covers the refusal.
func TestCanonicalizeRFCExamples(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{
  "numbers": [333333333.3333333, 1E-30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`, `{"literals":[null,true,false],"numbers":[333333333.3333333,1e-30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		{`{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`, "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
	} {
		got, err := canonicalize([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("got %s (%v)\nwant %s", got, err, c.want)
		}
	}
}

func TestCanonicalizeSameValueSameBytes(t *testing.T) {
	a, err1 := canonicalize([]byte(`{"b": [1, 2.0, 3e0], "a": {"y": "\u0041", "x": null}}`))
	b, err2 := canonicalize([]byte(" {\"a\":{\"x\":null,\"y\":\"A\"},\n\t\"b\":[1.0,2,30E-1]}"))
	if err1 != nil || err2 != nil || string(a) != string(b) || string(a) != `{"a":{"x":null,"y":"A"},"b":[1,2,3]}` {
		t.Fatalf("%s (%v) vs %s (%v)", a, err1, b, err2)
	}
	c, _ := canonicalize([]byte(`{"a":{"x":null,"y":"B"},"b":[1,2,3]}`))
	if string(c) == string(a) {
		t.Fatal("different values canonicalized to the same bytes")
	}
}

// Numbers are judged by value: refused when the value is not finite, is
// an integer above 2^53 in any spelling, or is not exactly what its
// canonical form denotes; otherwise the canonical form denotes the same
// value and canonicalizing it again is the identity.
func TestCanonicalizeNumberValues(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" means ErrNumber
	}{
		// Spellings the exponent and zero handling must read exactly.
		{"1.000000000000000000000000000000", "1"},
		{"0.000000000000000000001e21", "1"},
		{"100e-2", "1"},
		{"1e-0000000000000000000001", "0.1"},
		{"1e+0000000000000000000016", ""},
		{"12345678901234567e-16", "1.2345678901234567"},
		{"123456789012345678e-17", ""},
		{"1234567890123456700000e-21", "1.2345678901234567"},
		{"4.5e15", "4500000000000000"},
		{"0.0e1000000000000", "0"},
		{"-0e-1000000000000", "0"},
		{"1e1000000000", ""},
		{"1e-1000000000", ""},
		{"-9007199254740992e0", "-9007199254740992"},
		{"90071992547409920e-1", "9007199254740992"},
		{"90071992547409930e-1", ""},
		{"9007199254740992", "9007199254740992"},
		{"9007199254740992.0", "9007199254740992"},
		{"9.007199254740992e15", "9007199254740992"},
		{"-9007199254740992", "-9007199254740992"},
		{"1.5e15", "1500000000000000"},
		{"1e16", ""},
		{"1E16", ""},
		{"1.0e16", ""},
		{"10000000000000000", ""},
		{"9007199254740993", ""},
		{"9007199254740993.0", ""},
		{"-9007199254740993", ""},
		{"9007199254740992.5", ""},
		{"12345678901234567890", ""},
		{"1e300", ""},
		{"-1E30", ""},
		{"1e400", ""},
		{"-1e400", ""},
		{"1e-400", ""},
		{"1e-999999999", ""},
		{"333333333.33333329", ""},
		{"0.30000000000000001", ""},
		{"0.1", "0.1"},
		{"5e-324", "5e-324"},
		{"1.5", "1.5"},
		{"-0", "0"},
		{"-0.0", "0"},
		{"0e999999999", "0"},
		{"100", "100"},
		{"1e2", "100"},
		{"1e-7", "1e-7"},
		{"123e-20", "1.23e-18"},
		{"1.5e-7", "1.5e-7"},
		{"1.7976931348623157e308", ""},
		{"4.9406564584124654e-324", ""},
	} {
		got, err := canonicalize([]byte(c.in))
		if c.want == "" {
			if err != jcs.ErrNumber {
				t.Errorf("%s: got %s (%v), want ErrNumber", c.in, got, err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: got %s (%v), want %s", c.in, got, err, c.want)
			continue
		}
		if again, err := canonicalize(got); err != nil || string(again) != c.want {
			t.Errorf("%s: canonical %s again gives %s (%v)", c.in, got, again, err)
		}
	}
}

func TestCanonicalizeSyntax(t *testing.T) {
	for _, in := range []string{``, `{`, `{"a":1}{}`, `[1,]`, `{"a":1} x`} {
		if _, err := canonicalize([]byte(in)); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// FuzzCanonicalize: canonical output is valid JSON, canonicalizing it again
// is the identity, and it never fails on text the raw checks accept unless
// a number cannot keep its value.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1.5e3,"\u00e9",{"b":null,"a":true}]`, `"\ud83d\ude00"`, `-0.0`, `{"":{"":[]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if jsonx.Check(in) != nil {
			return
		}
		out, err := canonicalize(in)
		if err != nil {
			if err != jcs.ErrNumber {
				t.Fatalf("%q: %v", in, err)
			}
			return
		}
		// The length measured before decoding is the output's.
		if _, err := jcs.CanonicalizeMax(in, len(out)-1); err != jcs.ErrTooLarge {
			t.Fatalf("%q → %q: max %d gives %v, want ErrTooLarge", in, out, len(out)-1, err)
		}
		if err := jsonx.Check(out); err != nil {
			t.Fatalf("%q → %q is not valid JSON: %v", in, out, err)
		}
		again, err := canonicalize(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q → %q → %q (%v)", in, out, again, err)
		}
	})
}

// fastest returns the shortest of three runs of f.
func fastest(f func()) time.Duration {
	best := time.Duration(math.MaxInt64)
	for range 3 {
		start := time.Now()
		f()
		best = min(best, time.Since(start))
	}
	return best
}

// A number token is judged by its value in time linear in its length: a
// 2,000,000-digit token costs about what a string token of the same length
// costs, whatever its value, and a long spelling of a representable value
// (1.000…0) is accepted as that value.
func TestLongNumberTokenIsDecidedInLinearTime(t *testing.T) {
	const n = 2_000_000
	zeros := strings.Repeat("0", n)
	str := []byte(`{"a":"` + strings.Repeat("x", n) + `"}`)
	baseline := fastest(func() {
		if _, err := canonicalize(str); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		name, in, want string
		err            error
	}{
		{"value one", `{"a":1.` + zeros + `}`, `{"a":1}`, nil},
		{"scaled back to one", `{"a":0.` + zeros[1:] + `1e` + strconv.Itoa(n) + `}`, `{"a":1}`, nil},
		{"negative zero", `{"a":-0.` + zeros + `e-99999999999999999999}`, `{"a":0}`, nil},
		{"too many digits", `{"a":1.` + strings.Repeat("7", n) + `}`, "", jcs.ErrNumber},
		{"huge integer", `{"a":1` + zeros + `}`, "", jcs.ErrNumber},
		{"below the double range", `{"a":0.` + zeros + `1}`, "", jcs.ErrNumber},
		{"huge exponent", `{"a":1e` + strings.Repeat("9", n) + `}`, "", jcs.ErrNumber},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := []byte(c.in)
			var out []byte
			var err error
			took := fastest(func() { out, err = canonicalize(raw) })
			if err != c.err || string(out) != c.want {
				t.Errorf("got %.40q (%v), want %q (%v)", out, err, c.want, c.err)
			}
			if limit := 20*baseline + 50*time.Millisecond; took > limit {
				t.Errorf("took %v, a string token of the same length %v (limit %v)", took, baseline, limit)
			}
		})
	}
}

// CanonicalizeMax measures the canonical form exactly: whitespace does not
// count, an escape counts as what it stands for, a number as its canonical
// text. A refused number or a syntax error comes before the length.
func TestCanonicalizeMax(t *testing.T) {
	for _, in := range []string{
		` { "b" : "\u0041\/\u00e9\ud83d\ude00\u0001\u001f\"\\\b\f\n\r\t\u2028\u007f" , "a" : [1.0, 1e2, 1.5e15, 1e-7, -0, true, false, null, {}, []] } `,
		`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"x","1":"One","\ud83d\ude00":"e","\u0080":"c","\u00f6":"o"}`,
		`[333333333.3333333, 1E-30, 4.50, 2e-3, 0.000000000000000000000000001, "€$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"]`,
		`"\u0000\u0008\u000c\u0022\u005c"`,
		`-2.2250738585072014e-308`,
	} {
		want, err := canonicalize([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got, err := jcs.CanonicalizeMax([]byte(in), len(want)); err != nil || string(got) != string(want) {
			t.Errorf("%s with max %d: got %s (%v), want %s", in, len(want), got, err, want)
		}
		if got, err := jcs.CanonicalizeMax([]byte(in), len(want)-1); err != jcs.ErrTooLarge {
			t.Errorf("%s with max %d: got %s (%v), want ErrTooLarge", in, len(want)-1, got, err)
		}
	}
	long := `"` + strings.Repeat("x", 100) + `"`
	for in, want := range map[string]error{
		`{"a":` + long + `,"b":1e400}`: jcs.ErrNumber,
		`[` + long + `,1e16]`:          jcs.ErrNumber,
		`{"a":` + long + `,}`:          jcs.ErrSyntax,
		`[` + long + `] x`:             jcs.ErrSyntax,
	} {
		if _, err := jcs.CanonicalizeMax([]byte(in), 10); err != want {
			t.Errorf("%s: got %v, want %v", in, err, want)
		}
	}
}

// Refusing a value over the maximum decodes nothing: however many members
// it has, it costs one pass over the text and no allocation.
func TestCanonicalizeMaxRefusesWithoutDecoding(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"x":0`)
	for i := range 100_000 {
		b.WriteString(`,"k` + strconv.Itoa(i) + `":[1.5,"\u00e9",true]`)
	}
	b.WriteString(`}`)
	raw := []byte(b.String())
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := jcs.CanonicalizeMax(raw, 16<<10); err != jcs.ErrTooLarge {
			t.Fatalf("got %v, want ErrTooLarge", err)
		}
	})
	if allocs != 0 {
		t.Errorf("refusing a %d-byte value allocated %v times, want 0", len(raw), allocs)
	}
}

// canonicalize is jcs.CanonicalizeMax without a size limit.
func canonicalize(raw []byte) ([]byte, error) { return jcs.CanonicalizeMax(raw, math.MaxInt) }
