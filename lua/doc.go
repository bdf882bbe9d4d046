// Package lua holds every Redis Lua script of the service as a file in this
// folder, embedded with go:embed, and exports each one ready to run. The
// project Redis API's scripts live in project/ (named "project/<file>"), with
// the fragments only they share in project/lib/.
//
// Each script starts with a "#!lua" shebang that declares its flags: write
// scripts are refused up front when Redis is out of memory, and read-only
// scripts declare flags=no-writes so reads keep working under OOM. Every
// script reads the clock with TIME, touches only keys sharing one hash tag
// (so it runs unchanged on Redis Cluster), validates and reads before its
// first write, and checks redis.acl_check_cmd for its expiry command before
// writing a key that must carry a TTL. Run uses EVALSHA and reloads the
// script transparently on NOSCRIPT.
//
// # Shared text
//
// Checks and purges that several scripts need are written once, as
// fragments in the lib/ folder next to them. A script names a fragment on a
// line of its own, "--#include <name>", after its KEYS/ARGV header; at
// package init that line is replaced by the text of lib/<name>.lua from the
// script's folder (see compose). A fragment only
// defines local functions, and they take every key as an argument: the
// script passes its own KEYS, so it still touches only the keys it declares,
// on its one hash tag. Composition is plain text substitution of embedded
// files, so the same build always sends Redis the same text and the SHA
// stays the same across restarts and instances; Script.Source is that
// composed text. A script with an include line cannot be loaded from its
// file as it stands (redis-cli SCRIPT LOAD "$(cat …)"): load Source instead.
// A fragment cannot include another, and any other "--#" line is refused
// with a panic at package init, so a mistyped include stops the service and
// every test at start instead of reaching Redis as a comment.
//
// The fragments:
//   - key_types: keyTypesMatch, the up-front check that every key is missing
//     or of its expected type (every project script).
//   - topic_budget: topicBudget, the project's reliable-byte counters and their
//     consistency (topic publish, trim, delete).
//   - dedupe_expired: dedupeExpired, the expired dedupe records and the bytes
//     they hold (topic publish, trim, delete, subscription delete, state).
//   - dedupe_purge: dedupePurge, the removal of those records (the same
//     writers).
//   - same_subscriptions: sameSubscriptions, whether the topic's subscriptions
//     are still the ones the caller named keys for (publish, trim, delete).
//   - subscription: readSubscription, one subscription decoded (claim, ack,
//     receipts, subscription status and delete).
//   - cache_usage: cacheUsage, the cache meta checked against its index (cache
//     put, delete, state).
//   - cache_forget: cacheSizes, the recorded sizes of entries read and checked
//     before a script's first write, and cacheForget, those entries removed
//     from the cache index (cache put, delete, prune).
//   - legacy_deadline: legacyDeadline, the fixed legacy deadline applied to the
//     legacy container (cache put, delete, prune).
//
// Near-copies that stay, and why:
//   - ratelimit_sliding, ratelimit_fixed, ratelimit_bucket: three algorithms
//     with the same header and family loop; each stays whole in one file so
//     it can be read, and benchmarked with SCRIPT LOAD, on its own.
//   - idem_reserve and idem_takeover: the same replay/conflict replies, but
//     reserve takes a free lock and takeover only the one it saw; the shared
//     lines are the replies each must give, kept next to its own branch.
//   - idem_release and idem_abandon: both give a key back for its owner;
//     abandon also marks the token for a copy of the call that arrives later
//     and answers for an owner that does not know whether its call ran, so
//     the two keep their own replies.
//   - idem_complete/extend/release and lock_extend/release: the owner-token
//     compare (-1 no lock, 0 another owner); as a function it would return
//     the same three outcomes for every caller to branch on again.
//   - the call sites of dedupeExpired and readSubscription: TIME plus the
//     call and the caller's own reply for each outcome.
//   - project/cache_delete, cache_prune, cache_state: the clock read and the PEXPIREAT ACL
//     probe heading each script.
//   - project/topic_trim and project/topic_sub_delete: the 4-line "last open
//     receipt of a message" write, inside each script's own write loop.
//
// Scripts are immutable after package init and safe for concurrent use.
package lua
