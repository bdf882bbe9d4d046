package restapi

import "unicode"

const (
	zeroWidthJoiner    = '\u200D'
	zeroWidthNonJoiner = '\u200C'
	// A subdivision flag is the black flag, a run of tag characters (the
	// region's code, e.g. "gbsct") and the cancel tag that ends it.
	blackFlag = '\U0001F3F4'
	tagFirst  = '\U000E0020'
	tagLast   = '\U000E007E'
	cancelTag = '\U000E007F'
)

// hasHiddenChar reports whether s holds an invisible character that is not
// part of the text around it. Such characters let one name pose as another
// ("pay\u200Bpal", "admin\u3164" read as "paypal", "admin"), and the
// bidirectional ones reorder what follows ("invoice\u202Efdp.exe" shows as
// "invoiceexe.pdf"). Refused: every Unicode format character (category Cf:
// bidi marks, overrides and isolates, zero-width space, word joiner, byte
// order mark, soft hyphen, …) and every other default-ignorable character
// (Hangul fillers, the combining grapheme joiner, variation selectors),
// except where real text needs one:
//   - ZWJ (U+200D) or ZWNJ (U+200C) between two shown characters that it
//     joins or keeps apart (joins): emoji sequences (👨‍👩‍👧), Persian and
//     Indic words. Never at either end, beside white space or beside
//     another invisible character;
//   - a variation selector right after a character it picks a glyph for
//     (selects): "❤️" is U+2764 U+FE0F;
//   - tag characters (U+E0020–E007E) as one run after the black flag
//     U+1F3F4, ended by the cancel tag U+E007F: a subdivision flag (🏴󠁧󠁢󠁳󠁣󠁴󠁿).
func hasHiddenChar(s string) bool {
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == zeroWidthJoiner || r == zeroWidthNonJoiner:
			if i == 0 || i == len(rs)-1 || !joins(rs[i-1], rs[i+1]) {
				return true
			}
		case unicode.Is(unicode.Variation_Selector, r):
			if i == 0 || !selects(r, rs[i-1]) {
				return true
			}
		case r == blackFlag:
			j := i + 1
			for j < len(rs) && rs[j] >= tagFirst && rs[j] <= tagLast {
				j++
			}
			if j > i+1 {
				if j == len(rs) || rs[j] != cancelTag {
					return true
				}
				i = j // past the cancel tag
			}
		case unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point):
			return true
		}
	}
	return false
}

// shown reports whether r is drawn: not white space, a control, a format
// character or another default-ignorable character. A combining mark is
// drawn on the character before it.
func shown(r rune) bool {
	return !unicode.IsSpace(r) && !unicode.In(r, unicode.Z, unicode.Cc, unicode.Cf,
		unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

// joins reports whether a joiner between prev and next is part of the
// text. In an emoji sequence it stands between two emoji (the first may end
// in a skin tone, a variation selector or a subdivision flag's cancel tag):
// "🏳️‍🌈" is flag, U+FE0F, ZWJ, rainbow. In a word it stands between two
// letters or marks, one of them of a script whose letters join or form
// conjuncts (Arabic, Devanagari, Sinhala, …): "می‌خواهم" keeps two letters
// unjoined, "क्‍ष" asks for the half form of क after its virama. Between two
// letters of Latin, Greek, Cyrillic or the other scripts, or beside a digit
// or punctuation, it changes nothing, so "pay\u200Dpal" would read as
// "paypal".
func joins(prev, next rune) bool {
	if !shown(next) {
		return false
	}
	if unicode.Is(unicode.So, next) && (unicode.In(prev, unicode.So, unicode.Sk, unicode.Variation_Selector) || prev == cancelTag) {
		return true
	}
	return unicode.In(prev, unicode.L, unicode.M) && unicode.In(next, unicode.L, unicode.M) &&
		(shapes(prev) || shapes(next))
}

// shapes reports whether r is a letter or mark of a script whose letters
// change shape beside their neighbours.
func shapes(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M) && !unicode.In(r, unicode.Latin, unicode.Greek,
		unicode.Cyrillic, unicode.Armenian, unicode.Georgian, unicode.Han, unicode.Hiragana,
		unicode.Katakana, unicode.Hangul, unicode.Bopomofo, unicode.Common, unicode.Inherited)
}

// selects reports whether the variation selector vs may follow base. The
// Mongolian ones (U+180B–180D, U+180F) pick forms of Mongolian letters.
// The others pick emoji or text style and variants of symbols, digits and
// punctuation ("#️⃣", "❤️", "0︀"), and of the letters of the scripts that
// have variants: Han ideographs (U+E0100–E01EF, U+FE00–FE02), Myanmar,
// Phags-pa, Manichaean, Egyptian hieroglyphs. A letter or mark of another
// script has none, so "pay\uFE00pal" would read as "paypal".
func selects(vs, base rune) bool {
	if vs >= '\u180B' && vs <= '\u180F' {
		return unicode.Is(unicode.Mongolian, base)
	}
	if unicode.In(base, unicode.L, unicode.M) {
		return unicode.In(base, unicode.Han, unicode.Myanmar, unicode.Phags_Pa,
			unicode.Manichaean, unicode.Egyptian_Hieroglyphs)
	}
	return shown(base)
}
