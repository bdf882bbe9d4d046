package restapi

import (
	"testing"
	"unicode"
)

// Whatever hasHiddenChar accepts holds no format character but the joiners
// and the tags of a subdivision flag, and no joiner at either end.
func FuzzHasHiddenChar(f *testing.F) {
	for _, s := range []string{"", "\u200d", "a\u200d", "\u200da", "\U0001F3F4", "\U0001F3F4\U000E0067",
		"\uFE0F", "\u2764\uFE0F\u200d\U0001F525", "\U0001F3F4\U000E0067\U000E007F\u200d",
		"\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F\u200d\U0001F525",
		"\u0915\u094D\u200D\u0937", "\u0645\u06CC\u200C\u062E"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if hasHiddenChar(s) {
			return
		}
		rs := []rune(s)
		for i, r := range rs {
			joiner := r == zeroWidthJoiner || r == zeroWidthNonJoiner
			if joiner && (i == 0 || i == len(rs)-1) {
				t.Fatalf("%+q accepted with a joiner at an end", s)
			}
			if r >= '\U000E0000' && r <= cancelTag && !flagTag(rs, i) {
				t.Fatalf("%+q accepted with a tag outside a subdivision flag", s)
			}
			if unicode.Is(unicode.Cf, r) && !joiner && (r < '\U000E0000' || r > cancelTag) {
				t.Fatalf("%+q accepted with format character %U", s, r)
			}
		}
	})
}

// flagTag reports whether the tag rs[i] belongs to a run of lowercase tag
// letters and digits after a black flag.
func flagTag(rs []rune, i int) bool {
	for j := i - 1; j >= 0; j-- {
		if rs[j] == blackFlag {
			return true
		}
		if rs[j] < '\U000E0030' || rs[j] > '\U000E007A' || (rs[j] > '\U000E0039' && rs[j] < '\U000E0061') {
			return false
		}
	}
	return false
}
