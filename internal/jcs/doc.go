// Package jcs implements the JSON Canonicalization Scheme of RFC 8785: the
// normalized form two JSON texts are compared in (the project Redis API
// dedupes publishes by it). Two texts are the same value iff their
// canonical forms are byte-equal.
//
// Numbers are IEEE-754 doubles, as RFC 8785 requires; an integer literal
// beyond ±2^53 is refused rather than silently rounded. The package keeps
// no state and is safe for concurrent use.
package jcs
