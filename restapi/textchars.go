package restapi

import (
	"sort"
	"unicode"
)

const (
	zeroWidthJoiner    = '\u200D'
	zeroWidthNonJoiner = '\u200C'
	emojiStyle         = '\uFE0F'
	// A subdivision flag is the black flag, the subdivision's code in tag
	// letters and digits (e.g. "gbsct") and the cancel tag that ends it.
	blackFlag = '\U0001F3F4'
	cancelTag = '\U000E007F'
)

// hasHiddenChar reports whether s holds an invisible character that is not
// part of the text around it. Such characters let one name pose as another
// ("pay\u200Bpal", "admin\u3164" read as "paypal", "admin"), and the
// bidirectional ones reorder what follows ("invoice\u202Efdp.exe" shows as
// "invoiceexe.pdf"). Refused: every Unicode format character (category Cf:
// bidi marks, overrides and isolates, zero-width space, word joiner, byte
// order mark, soft hyphen, tag characters, …) and every other
// default-ignorable character (Hangul fillers, the combining grapheme
// joiner, variation selectors), except where real text needs one:
//   - ZWJ (U+200D) between two emoji of a sequence (👨‍👩‍👧) or next to a
//     virama (a half form, "क्‍ष"), ZWNJ (U+200C) between two letters of a
//     joining or conjunct-forming script (Persian "می‌خواهم"): see joins;
//   - a variation selector right after a character it picks a glyph for
//     (selects): "❤️" is U+2764 U+FE0F;
//   - the tags of a subdivision flag (subdivisionFlag): 🏴󠁧󠁢󠁳󠁣󠁴󠁿 is U+1F3F4,
//     "gbsct" in tag characters, U+E007F.
func hasHiddenChar(s string) bool {
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == zeroWidthJoiner || r == zeroWidthNonJoiner:
			if i == 0 || i == len(rs)-1 || !joins(rs, i) {
				return true
			}
		case unicode.Is(unicode.Variation_Selector, r):
			if i == 0 || !selects(r, rs[i-1]) {
				return true
			}
		case r == blackFlag:
			n, ok := subdivisionFlag(rs[i+1:])
			if !ok {
				return true
			}
			i += n // the tags, up to the cancel tag
		case unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point):
			return true
		}
	}
	return false
}

// subdivisionFlag reads the tags after a black flag and reports how many
// there are, cancel tag included, and whether they may stand there. None is
// the plain black flag. Otherwise they are a subdivision's code: its
// region's two letters and one to four letters or digits, each as a tag
// lowercase letter (U+E0061–E007A) or tag digit (U+E0030–E0039), then the
// cancel tag U+E007F ("gbeng", "gbsct", "gbwls"). Any other run of tags
// would hide text behind the flag: "🏴" and U+E0049 U+E0067 U+E006E … (the
// tag forms of "Ign…") show as the black flag alone.
func subdivisionFlag(rs []rune) (int, bool) {
	n := 0
	for n < len(rs) && rs[n] >= '\U000E0000' && rs[n] <= cancelTag {
		n++
	}
	if n == 0 {
		return 0, true
	}
	code := rs[:n-1]
	if rs[n-1] != cancelTag || len(code) < 3 || len(code) > 6 {
		return n, false
	}
	for k, t := range code {
		letter := t >= '\U000E0061' && t <= '\U000E007A'
		digit := t >= '\U000E0030' && t <= '\U000E0039'
		if !letter && (k < 2 || !digit) {
			return n, false
		}
	}
	return n, true
}

// shown reports whether r is drawn: not white space, a control, a format
// character or another default-ignorable character. A combining mark is
// drawn on the character before it.
func shown(r rune) bool {
	return !unicode.IsSpace(r) && !unicode.In(r, unicode.Z, unicode.Cc, unicode.Cf,
		unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

// joins reports whether the joiner rs[i] (neither first nor last) changes
// how the text around it is drawn. Where it changes nothing, two different
// strings look the same: "pay\u200Dpal" reads as "paypal", "مح\u200Dمد" as
// "محمد" (Arabic letters join anyway), "★\u200D★" and "©\u200D™" as "★★"
// and "©™" (symbols that are no emoji). So:
//   - ZWJ between two emoji of a sequence: "🏳️‍🌈" is flag, U+FE0F, ZWJ,
//     rainbow. The first may end in a skin tone, U+FE0F or a subdivision
//     flag's cancel tag (emojiEnd, emojiStart);
//   - ZWJ right after a virama before a letter ("क्‍ष" asks for the half form
//     of क), or between a letter and the virama after it (Bengali
//     "র‍্য", Sinhala touching letters);
//   - ZWNJ between two letters or marks, one of them of a script whose
//     letters join or form conjuncts (conjoins): "می‌خواهم" keeps two letters
//     unjoined.
func joins(rs []rune, i int) bool {
	prev, next := rs[i-1], rs[i+1]
	if !shown(next) {
		return false
	}
	if rs[i] == zeroWidthNonJoiner {
		return unicode.In(prev, unicode.L, unicode.M) && unicode.In(next, unicode.L, unicode.M) &&
			(conjoins(prev) || conjoins(next))
	}
	if emojiEnd(rs[:i]) && emojiStart(rs[i+1:]) {
		return true
	}
	return (virama(prev) && unicode.Is(unicode.L, next)) || (unicode.Is(unicode.L, prev) && virama(next))
}

// emojiEnd reports whether rs ends in an emoji: one drawn as emoji by
// default, one with a skin tone, U+FE0F after a symbol that has an emoji
// form, or a subdivision flag (its cancel tag is only ever let through at
// the end of a valid flag).
func emojiEnd(rs []rune) bool {
	last := rs[len(rs)-1]
	switch {
	case last == cancelTag || inRanges(emojiPresentation, last):
		return true
	case last == emojiStyle && len(rs) > 1:
		return inRanges(emojiSymbol, rs[len(rs)-2])
	}
	return false
}

// emojiStart reports whether rs starts with an emoji: one drawn as emoji
// by default, or a symbol with an emoji form followed by U+FE0F ("👩‍⚕️").
func emojiStart(rs []rune) bool {
	return inRanges(emojiPresentation, rs[0]) ||
		(len(rs) > 1 && rs[1] == emojiStyle && inRanges(emojiSymbol, rs[0]))
}

// emojiPresentation approximates the characters drawn as emoji without a
// selector: the emoji blocks of the supplementary planes (pictographs,
// emoticons, transport, skin tones, regional indicators) and the few older
// symbols drawn as emoji by default (⌚, ⚡, ⭐, ⬛, …).
var emojiPresentation = []runeRange{
	{0x231A, 0x231B}, {0x23E9, 0x23EC}, {0x23F0, 0x23F0}, {0x23F3, 0x23F3}, {0x25FD, 0x25FE},
	{0x2614, 0x2615}, {0x2648, 0x2653}, {0x267F, 0x267F}, {0x2693, 0x2693}, {0x26A1, 0x26A1},
	{0x26AA, 0x26AB}, {0x26BD, 0x26BE}, {0x26C4, 0x26C5}, {0x26CE, 0x26CE}, {0x26D4, 0x26D4},
	{0x26EA, 0x26EA}, {0x26F2, 0x26F3}, {0x26F5, 0x26F5}, {0x26FA, 0x26FA}, {0x26FD, 0x26FD},
	{0x2705, 0x2705}, {0x270A, 0x270B}, {0x2728, 0x2728}, {0x274C, 0x274C}, {0x274E, 0x274E},
	{0x2753, 0x2755}, {0x2757, 0x2757}, {0x2795, 0x2797}, {0x27B0, 0x27B0}, {0x27BF, 0x27BF},
	{0x2B1B, 0x2B1C}, {0x2B50, 0x2B50}, {0x2B55, 0x2B55}, {0x1F004, 0x1F004}, {0x1F0CF, 0x1F0CF},
	{0x1F18E, 0x1F18E}, {0x1F191, 0x1F19A}, {0x1F1E6, 0x1F1FF}, {0x1F300, 0x1F64F},
	{0x1F680, 0x1F6FF}, {0x1F7E0, 0x1F7F0}, {0x1F90C, 0x1F9FF}, {0x1FA70, 0x1FAFF},
}

// emojiSymbol approximates the characters that have an emoji form U+FE0F
// asks for: the emoji and the symbols of the blocks emoji come from (©, ™,
// arrows, technical and geometric shapes, dingbats, ❤, ♀, ⚕, …).
var emojiSymbol = []runeRange{
	{0x00A9, 0x00A9}, {0x00AE, 0x00AE}, {0x203C, 0x203C}, {0x2049, 0x2049}, {0x2122, 0x2122},
	{0x2139, 0x2139}, {0x2194, 0x21AA}, {0x2300, 0x23FF}, {0x24C2, 0x24C2}, {0x25A0, 0x27BF},
	{0x2934, 0x2935}, {0x2B00, 0x2BFF}, {0x3030, 0x3030}, {0x303D, 0x303D}, {0x3297, 0x3297},
	{0x3299, 0x3299}, {0x1F000, 0x1FAFF},
}

// runeRange is the code points from its first to its last, both included.
type runeRange [2]rune

// inRanges reports whether r falls in one of the ranges, sorted in ascending order.
func inRanges(ranges []runeRange, r rune) bool {
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i][1] >= r })
	return i < len(ranges) && ranges[i][0] <= r
}

// virama reports whether r is the virama (halant) of an Indic script, the
// mark that kills a consonant's vowel so that it joins the next one.
func virama(r rune) bool {
	switch r {
	case '\u094D', '\u09CD', '\u0A4D', '\u0ACD', '\u0B4D', '\u0BCD', '\u0C4D',
		'\u0CCD', '\u0D3B', '\u0D3C', '\u0D4D', '\u0DCA', '\u1039', '\u17D2', '\u1B44', '\uA8C4':
		return true
	}
	return false
}

// conjoins reports whether r is a letter or mark of a script whose letters
// join (Arabic, Syriac, N'Ko, Mongolian, …) or form conjuncts (Devanagari,
// Bengali, Tamil, Sinhala, Myanmar, Khmer, …), where ZWNJ keeps two of them
// apart.
func conjoins(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M) && unicode.In(r, unicode.Arabic, unicode.Syriac,
		unicode.Nko, unicode.Mongolian, unicode.Mandaic, unicode.Adlam, unicode.Hanifi_Rohingya,
		unicode.Devanagari, unicode.Bengali, unicode.Gurmukhi, unicode.Gujarati, unicode.Oriya,
		unicode.Tamil, unicode.Telugu, unicode.Kannada, unicode.Malayalam, unicode.Sinhala,
		unicode.Myanmar, unicode.Khmer, unicode.Balinese, unicode.Saurashtra)
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
