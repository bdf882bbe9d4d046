// Package auth verifies the bearer JWTs that authenticate every REST and
// WebSocket request of the gateway and turns a valid token into a
// [Principal].
//
// A [Verifier] is safe for concurrent use by any number of goroutines. The
// verification keys live in an immutable key set that is swapped atomically
// when the JWKS is reloaded, so the hot path takes no lock. Its mutex guards
// only the unknown-kid bookkeeping: the bounded map of per-kid "no refetch
// before" times, the map of in-flight per-kid resolutions that concurrent
// misses share, the newest refetch with its generation counter, the time
// before which no refetch starts, the time of the last "too many unknown
// kids" warning, and whether the Verifier is closed. Refetches are
// single-flight: at most one runs per Verifier, and every miss that arrives
// while it runs waits for its result instead of fetching again. The
// resolution of an unknown kid runs in its own goroutine, detached from the
// request that started it; every miss, that request's included, waits for it
// only as long as its own context allows. [Verifier.Close] cancels a
// resolution in progress and waits for it; Verify keeps working afterwards
// with the keys it has, but fetches no more.
//
// Accepted algorithms are RS256, ES256 and EdDSA with keys from a JWKS (file
// or URL) and, only when a dev secret is configured outside prod, HS256. A
// token's alg must match the type of the key its kid names, so neither
// alg=none nor algorithm confusion (an HS256 token keyed with a public key,
// an RS256 header naming an EC key) is accepted. Key material is never taken
// from a token's own headers (jku, jwk, x5u, x5c are ignored), and a token
// with a crit header is rejected because no extension is understood.
//
// Required claims are sub (a UUID, returned in canonical lower case; the nil
// UUID is refused) and exp; iss and aud are checked when configured, nbf and
// iat are honoured, all with a 30 s leeway by default. The typ claim selects
// the token kind: absent or "user" is a user token, "service" a service token
// (its svc claim, when present, must be 1..64 characters of [A-Za-z0-9._-]
// because it ends up in Redis key names), anything else is rejected. Claim
// names are matched exactly, in their letter case: a custom claim named
// "TYP", "Sub" or "EXP" is an unknown claim, ignored, and never read as typ,
// sub or exp (so it cannot stand in for a missing exp either).
//
// Unknown kid: the JWKS source is refetched at most once per 10 s per
// Verifier, whatever kids the tokens name (a failed refetch counts; the load
// at startup does not), so a flood of tokens with random kids costs at most
// one fetch per 10 s. A miss inside that gap is rejected without a fetch, a
// Redis round trip or any record, so a key published by a rotation is
// accepted at the latest 10 s after its first use (unless its kid was already
// tried, and found missing, before it was published). Past the gap, a miss
// first consults the shared Redis negative marker
// han:api:jwks:negative:<hex sha256(kid)>; if it is present the token is
// rejected without a fetch. Otherwise the JWKS is refetched, and a kid that
// is still unknown gets no further refetch for RefetchInterval and is
// recorded in the marker for NegativeTTL. Redis errors only cost that
// cross-instance optimisation: they are logged at debug level and the local
// limits still apply. The local per-kid map holds at most 1024 kids; when it
// is full of fresh entries further kids are not recorded, and only the 10 s
// limit applies to them. There is no periodic refresh: a key removed from the
// JWKS stays trusted until the next refetch, which any unknown kid triggers.
//
// Startup: [NewVerifier] loads the JWKS once and fails if it cannot be loaded
// at all (unreachable URL, unreadable file, invalid document), or if no
// usable key exists in it and no dev secret is configured ([ErrNoKeys]). A
// later refetch that fails, or that returns no usable key, keeps the previous
// keys. In prod the JWKS URL must be https and a dev secret is refused. A
// fetch from an https URL follows redirects only to https URLs, whatever
// HTTPClient is configured: a redirect to plain http would let whoever
// answers it choose the keys, so it fails the fetch (at startup NewVerifier
// fails; later the previous keys stay). JWKS documents are capped at 1 MiB.
//
// Keys: go-jose decodes each JWK; the choice of which keys may verify is made
// here. A key is used only if its use is absent or "sig", its key_ops (when
// present) include "verify", its alg (when present) is the one its type
// implies, and it is an RSA public key with a 2048..4096-bit modulus (4096 is
// go-jose's ceiling) and an odd exponent of at most 32 bits, an EC public key
// on P-256 (the point must lie on the curve), or an Ed25519 public key (not a
// low-order point). Private keys found in a JWKS are skipped, since anyone who
// fetched the document could sign with them; so are symmetric keys, other key
// types and curves, values in padded base64, and keys whose x5c certificate
// does not parse or does not hold the same key. Skipped keys are counted in a
// debug log; the other keys of the document stay usable.
//
// Errors returned by Verify wrap [ErrUnauthorized] and a short reason (and,
// where one applies, the matching golang-jwt sentinel such as
// jwt.ErrTokenExpired); they never contain the token or claim values. Logs
// carry at most the kid's SHA-256 hash, never the token, claims or keys.
package auth
