package store

// ProjectKeys builds every physical Redis key of one project of the project
// Redis API (CONTRACT §9). It is the only place that does: handlers and
// clients deal in relative keys and resource ids.
//
// Every key starts with han:prj:{<env>:<project_id>}:, so all of a
// project's keys share one hash tag and every project script is single-slot
// on Redis Cluster. Relative cache keys are appended after the tag; a '{' or
// '}' inside them cannot change the slot because Redis hashes the first
// {...} of a key only.
//
// Layout (part 1; part 2 adds topics, subscriptions, receipts and budgets
// under the same prefix):
//
//	…:meta             HASH  mirror of PostgreSQL project metadata (quota, paused,
//	                         legacyDeadline) + the cache write sequence (seq) and
//	                         the cache usage counter (cacheBytes); no TTL
//	…:cache            HASH  legacy v1 cache container (relative key → {"type","value"})
//	…:cache:idx        ZSET  write sequence → relative key; no TTL (metadata)
//	…:cache:exp        ZSET  expiresAt ms → relative key; no TTL (metadata)
//	…:cache:sz         HASH  relative key → sizeBytes; no TTL (metadata)
//	…:cache:e:<key>    HASH  one cache entry {t, v, e, u, s}; PEXPIREAT its deadline
type ProjectKeys struct {
	prefix string // han:prj:{<env>:<project_id>}:
}

// NewProjectKeys returns the key builder of one project. env is HAN_ENV
// (validated by config: no braces, colons or spaces); projectID is a
// canonical UUID.
func NewProjectKeys(env, projectID string) ProjectKeys {
	return ProjectKeys{prefix: "han:prj:{" + env + ":" + projectID + "}:"}
}

// Prefix is han:prj:{<env>:<project_id>}: (for scans in tests and tools).
func (k ProjectKeys) Prefix() string { return k.prefix }

// Meta is the project's metadata HASH.
func (k ProjectKeys) Meta() string { return k.prefix + "meta" }

// CacheContainer is the legacy v1 cache container HASH.
func (k ProjectKeys) CacheContainer() string { return k.prefix + "cache" }

// CacheIndex is the write-sequence index ZSET.
func (k ProjectKeys) CacheIndex() string { return k.prefix + "cache:idx" }

// CacheExpiry is the ZSET of entry deadlines.
func (k ProjectKeys) CacheExpiry() string { return k.prefix + "cache:exp" }

// CacheSizes is the HASH of entry sizes.
func (k ProjectKeys) CacheSizes() string { return k.prefix + "cache:sz" }

// CacheEntry is the HASH of one cache entry.
func (k ProjectKeys) CacheEntry(rel string) string { return k.prefix + "cache:e:" + rel }

// CacheEntryPrefix is the common prefix of every cache entry key.
func (k ProjectKeys) CacheEntryPrefix() string { return k.prefix + "cache:e:" }

// cacheScriptKeys are KEYS[1..5] of the cache scripts (meta, index, expiry,
// sizes, container); put and delete append the entry as KEYS[6].
func (k ProjectKeys) cacheScriptKeys(extra ...string) []string {
	return append([]string{k.Meta(), k.CacheIndex(), k.CacheExpiry(), k.CacheSizes(), k.CacheContainer()}, extra...)
}
