// Package jcs implements the JSON Canonicalization Scheme of RFC 8785: the
// normalized form two JSON texts are compared in (the project Redis API
// dedupes publishes by it). Two texts are the same value iff their
// canonical forms are byte-equal.
//
// Numbers are IEEE-754 doubles, as RFC 8785 requires, and are judged by
// their value, not their spelling: a number whose canonical form would not
// denote exactly the value written (an integer above ±2^53 however spelled,
// a value a double cannot hold, one out of the double range) is refused
// rather than silently changed. A number is decided in time linear in the
// length of its token, however many digits it is spelled with.
//
// CanonicalizeMax bounds the length of the canonical form; the length is
// measured in one pass over the tokens before anything is decoded, so a
// value far over the bound is refused at the cost of reading it. The
// package keeps no state and is safe for concurrent use.
package jcs
