package jcs

import (
	"slices"
	"testing"
	"unicode/utf16"
)

// compareUTF16 orders names as their UTF-16 code units do (characters
// above U+FFFF sort between U+D7FF and U+E000), prefixes first, without
// allocating.
func TestCompareUTF16(t *testing.T) {
	names := []string{"", "a", "ab", "b", "\u00e9", "\u20ac", "\ud7ff", "\ue000", "\ufb33", "\uffff",
		"\U00010000", "\U0001f600", "\U0001f600a", "\U0010ffff", "a\U0001f600", "a\uffff", "\x80", "\xff", "a\xffb"}
	ref := func(a, b string) int {
		return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
	}
	for _, a := range names {
		for _, b := range names {
			got, want := compareUTF16(a, b), ref(a, b)
			if (got < 0) != (want < 0) || (got == 0) != (want == 0) {
				t.Errorf("compareUTF16(%+q, %+q) = %d, want the sign of %d", a, b, got, want)
			}
		}
	}
	a, b := "key\U0001f600x", "key\uffffx"
	if n := testing.AllocsPerRun(100, func() { compareUTF16(a, b) }); n != 0 {
		t.Errorf("compareUTF16 allocates %v times per call", n)
	}
}
