// Package auth verifies the bearer JWTs that authenticate every REST and
// WebSocket request of the gateway and turns a valid token into
// a [Principal].
//
// A [Verifier] is safe for concurrent use by any number of goroutines. The
// verification keys live in an immutable key set that is swapped atomically
// when the JWKS is reloaded, so the hot path takes no lock. Its mutex guards
// only the unknown-kid bookkeeping: the bounded map of per-kid "no refetch
// before" times, the map of in-flight per-kid resolutions that concurrent
// misses share, the fetch generation counters and the time of the last "too
// many unknown kids" warning. A separate one-slot semaphore serialises JWKS
// fetches, so at most one fetch is in flight per Verifier, and a miss that
// queued behind a fetch which started after it reuses that fetch's result
// instead of fetching again.
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
// because it ends up in Redis key names), anything else is rejected.
//
// Unknown kid: a miss first consults the shared Redis negative marker
// han:api:jwks:negative:<hex sha256(kid)>; if it is present the token is
// rejected without a fetch. Otherwise the JWKS is refetched at most once per
// RefetchInterval per kid, and a kid that is still unknown is recorded in the
// marker for NegativeTTL. Redis errors only cost that cross-instance
// optimisation: they are logged at debug level and the local per-kid limit
// still applies. The local map holds at most 1024 kids; when it is full of
// fresh entries, further unknown kids are rejected without a fetch until
// entries age out, so a flood of random kids cannot turn into a flood of
// fetches. There is no periodic refresh: a key removed from the JWKS stays
// trusted until the next refetch, which any unknown kid triggers.
//
// Startup: [NewVerifier] loads the JWKS once and fails if it cannot be loaded
// at all (unreachable URL, unreadable file, invalid document), or if no
// usable key exists in it and no dev secret is configured ([ErrNoKeys]). A
// later refetch that fails, or that returns no usable key, keeps the previous
// keys. In prod the JWKS URL must be https and a dev secret is refused. JWKS
// documents are capped at 1 MiB; RSA keys must have 2048..8192-bit moduli, EC
// points must lie on P-256.
//
// Errors returned by Verify wrap [ErrUnauthorized] and a short reason (and,
// where one applies, the matching golang-jwt sentinel such as
// jwt.ErrTokenExpired); they never contain the token or claim values. Logs
// carry at most the kid's SHA-256 hash, never the token, claims or keys.
package auth
