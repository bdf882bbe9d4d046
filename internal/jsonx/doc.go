// Package jsonx is the strict JSON decoding helper that every HTTP endpoint
// of the gateway uses to validate and decode request bodies.
//
// All functions in this package are safe for concurrent use: they keep no
// state between calls.
//
// Go's JSON decoders are lenient in ways that matter for a chat backend: they
// silently replace invalid UTF-8 and unpaired UTF-16 surrogate escapes with
// U+FFFD, and when an object repeats a key the last occurrence wins without
// any error. [Check] therefore scans the raw body once, by hand, before any
// decoding happens, and refuses:
//
//   - anything that is not RFC 8259 JSON, including empty input and
//     trailing data after the value ([ReasonSyntax]);
//   - raw bytes that are not valid UTF-8 ([ReasonInvalidUTF8]);
//   - \uD800-\uDFFF escapes that do not form a high+low surrogate pair
//     ([ReasonLoneSurrogate]);
//   - objects that repeat a key, compared after unescaping, so "a" and
//     "\u0061" are the same key ([ReasonDuplicateKey]);
//   - nesting deeper than [MaxDepth] ([ReasonDepth]).
//
// When a body has several problems, the one that comes first in the input
// is reported.
//
// [DecodeObject] runs [Check], requires the top-level value to be an object
// and then decodes it with github.com/segmentio/encoding/json. [TopLevel]
// runs the same checks and returns the raw top-level members so a handler
// can inspect a field's exact token (absent, null, 1.0, 1e3, "60", ...).
//
// Every refusal is an [*Error] that carries a [Reason], the path of object
// keys and array indexes leading to the problem, and the byte offset. Its
// Error method never includes any part of the input.
package jsonx
