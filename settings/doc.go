// Package settings serves the runtime settings that live versioned in
// PostgreSQL (docs/runtime-settings.md): rate-limit policy
// overrides and named tunables. A Provider is the rate limiter's
// ratelimit.PolicyProvider: a change committed in PostgreSQL reaches every
// instance within one refresh interval, without a restart.
//
// Each instance checks the one-row settings head on every tick: the version
// and the stamp PostgreSQL draws anew on every change. A settings state is
// that pair, never the number alone: after PostgreSQL went back in time (a
// failover to a replica that missed the last commit, a restore) a version
// lower than the one in force, or an equal one with another stamp, is the
// truth and is applied like any new state. On a new state it reads the
// shared snapshot han:settings:snapshot:<version>:<stamp> from Redis DB1
// (5 min TTL); when that is missing, the instance that takes
// han:coord:lock:settings-refresh:{<scope>} reads PostgreSQL and publishes
// the snapshot, while the others wait briefly for it (and read PostgreSQL
// themselves if it does not come), so a change costs PostgreSQL one full
// read rather than one per instance. PostgreSQL stays the truth: a missing
// or unreachable Redis only means every instance reads it directly, and so
// does a shared snapshot that cannot be used (not signed with the
// deployment's secret for its key, unreadable, over MaxSnapshotBytes, or
// not a valid version): it is a copy, never the reason to refuse a state,
// and the lock holder replaces it. An invalid version
// (its rows in PostgreSQL) is refused as a whole and the previous snapshot
// stays in force.
//
// A Provider is safe for concurrent use; Policies never blocks (an atomic
// pointer to an immutable snapshot). Start runs one goroutine until Close.
package settings
