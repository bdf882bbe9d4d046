package project

// Keys builds every physical Redis key of one project of the project
// Redis API (docs/project-redis-api.md). It is the only place that does: handlers and
// clients deal in relative keys and resource ids.
//
// Every key starts with han:prj:{<env>:<project_id>}:, so all of a
// project's keys share one hash tag and every project script is single-slot
// on Redis Cluster. Relative cache keys are appended after the tag; a '{' or
// '}' inside them cannot change the slot because Redis hashes the first
// {...} of a key only.
//
// Layout of the cache:
//
//	…:meta             HASH  mirror of PostgreSQL project metadata (quota, paused,
//	                         legacyDeadline) + the cache write sequence (seq) and
//	                         the cache usage counter (cacheBytes); no TTL
//	…:cache            HASH  legacy v1 cache container (relative key → {"type","value"})
//	…:cache:idx        ZSET  write sequence → relative key; no TTL (metadata)
//	…:cache:exp        ZSET  expiresAt ms → relative key; no TTL (metadata)
//	…:cache:sz         HASH  relative key → sizeBytes; no TTL (metadata)
//	…:cache:e:<key>    HASH  one cache entry {t, v, e, u, s}; PEXPIREAT its deadline
//
// Topics, subscriptions, receipts, budgets (reliable keys, no TTL):
//
//	…:q:topics         HASH  topicId → topic JSON {id, name, description, createdAt}
//	…:q:tnames         HASH  topic name → topicId
//	…:q:subs           HASH  subscriptionId → subscription JSON {id, topicId, name,
//	                         status, createdAt, from, pos}
//	…:q:budget         HASH  reliable bytes: msg, rcpt, dd; tb:<topicId> (message bytes of a topic)
//	…:q:dd             HASH  publish identity → dedupe JSON {m, f, a, z, b, x}
//	…:q:ddx            ZSET  publish identity → dedupe expiresAt ms
//	…:t:<tid>:s        STREAM the topic's messages {p, c, d, z, a, b}
//	…:t:<tid>:subs     SET   the topic's subscription ids
//	…:t:<tid>:o        HASH  messageId → receipts not yet terminal
//	…:t:<tid>:d        ZSET  messages terminal for every subscription (trimmable)
//	…:s:<sid>:r        HASH  messageId → receipt JSON {s, a, l, u, r, h}
//	…:s:<sid>:l        ZSET  leaseUntil ms → messageId (leased receipts)
//
// The module-wide budget lives under its own tag (ModuleKeys).
type Keys struct {
	prefix string // han:prj:{<env>:<project_id>}:
}

// NewKeys returns the key builder of one project. env is HAN_ENV
// (validated by config: no braces, colons or spaces); projectID is a
// canonical UUID.
func NewKeys(env, projectID string) Keys {
	return Keys{prefix: "han:prj:{" + env + ":" + projectID + "}:"}
}

// Prefix is han:prj:{<env>:<project_id>}: (for scans in tests and tools).
func (k Keys) Prefix() string { return k.prefix }

// Meta is the project's metadata HASH.
func (k Keys) Meta() string { return k.prefix + "meta" }

// CacheContainer is the legacy v1 cache container HASH.
func (k Keys) CacheContainer() string { return k.prefix + "cache" }

// CacheIndex is the write-sequence index ZSET.
func (k Keys) CacheIndex() string { return k.prefix + "cache:idx" }

// CacheExpiry is the ZSET of entry deadlines.
func (k Keys) CacheExpiry() string { return k.prefix + "cache:exp" }

// CacheSizes is the HASH of entry sizes.
func (k Keys) CacheSizes() string { return k.prefix + "cache:sz" }

// CacheEntry is the HASH of one cache entry.
func (k Keys) CacheEntry(rel string) string { return k.prefix + "cache:e:" + rel }

// CacheEntryPrefix is the common prefix of every cache entry key.
func (k Keys) CacheEntryPrefix() string { return k.prefix + "cache:e:" }

// cacheScriptKeys are KEYS[1..5] of the cache scripts (meta, index, expiry,
// sizes, container); put and delete append the entry as KEYS[6].
func (k Keys) cacheScriptKeys(extra ...string) []string {
	return append([]string{k.Meta(), k.CacheIndex(), k.CacheExpiry(), k.CacheSizes(), k.CacheContainer()}, extra...)
}

// Topics is the HASH of the project's topics.
func (k Keys) Topics() string { return k.prefix + "q:topics" }

// TopicNames is the HASH topic name → topic id.
func (k Keys) TopicNames() string { return k.prefix + "q:tnames" }

// Subscriptions is the HASH of the project's subscriptions.
func (k Keys) Subscriptions() string { return k.prefix + "q:subs" }

// Budget is the HASH of the project's reliable-byte counters.
func (k Keys) Budget() string { return k.prefix + "q:budget" }

// Dedupe is the HASH publish identity → dedupe record.
func (k Keys) Dedupe() string { return k.prefix + "q:dd" }

// DedupeExpiry is the ZSET publish identity → expiry.
func (k Keys) DedupeExpiry() string { return k.prefix + "q:ddx" }

// TopicStream is the STREAM of a topic's messages.
func (k Keys) TopicStream(topicID string) string { return k.prefix + "t:" + topicID + ":s" }

// TopicSubscriptions is the SET of a topic's subscription ids.
func (k Keys) TopicSubscriptions(topicID string) string {
	return k.prefix + "t:" + topicID + ":subs"
}

// TopicOpen is the HASH messageId → receipts of it not yet terminal.
func (k Keys) TopicOpen(topicID string) string { return k.prefix + "t:" + topicID + ":o" }

// TopicDone is the ZSET of messages terminal for every subscription.
func (k Keys) TopicDone(topicID string) string { return k.prefix + "t:" + topicID + ":d" }

// TopicPrefix is the common prefix of a topic's keys.
func (k Keys) TopicPrefix(topicID string) string { return k.prefix + "t:" + topicID + ":" }

// Receipts is the HASH of a subscription's receipts.
func (k Keys) Receipts(subID string) string { return k.prefix + "s:" + subID + ":r" }

// Leases is the ZSET of a subscription's leased receipts by deadline.
func (k Keys) Leases(subID string) string { return k.prefix + "s:" + subID + ":l" }

// SubscriptionPrefix is the common prefix of a subscription's keys.
func (k Keys) SubscriptionPrefix(subID string) string { return k.prefix + "s:" + subID + ":" }

// ModuleKeys builds the keys of the module-wide budget of one environment:
// han:prj:{<env>:module}:…, a hash tag no project can have (project ids are
// UUIDs), so it sits outside every project's slot.
//
//	…:budget    HASH committed, reserved, leased, gen, rstart, rpos
//	…:resv      HASH reservation id → "<amount>:<created ms>"
//	…:leases    HASH lease id → "<amount>:<expires ms>"
//	…:projects  SET  project ids that may hold reliable bytes (the reconcile scan)
//	…:seen      HASH project id → ms of the last reservation or lease call naming it
type ModuleKeys struct {
	prefix string
}

// NewModuleKeys returns the module budget keys of env (HAN_ENV).
func NewModuleKeys(env string) ModuleKeys { return ModuleKeys{prefix: "han:prj:{" + env + ":module}:"} }

// Budget is the module budget HASH.
func (m ModuleKeys) Budget() string { return m.prefix + "budget" }

// Reservations is the HASH of open reservations.
func (m ModuleKeys) Reservations() string { return m.prefix + "resv" }

// Leases is the HASH of the leases instances hold.
func (m ModuleKeys) Leases() string { return m.prefix + "leases" }

// Projects is the SET of project ids the reconcile job sums.
func (m ModuleKeys) Projects() string { return m.prefix + "projects" }

// Seen is the HASH project id → ms of the last reservation or lease call
// that named it: the reconcile drops an id from Projects only once this
// is old and its budget is empty.
func (m ModuleKeys) Seen() string { return m.prefix + "seen" }

// Prefix is han:prj:{<env>:module}:.
func (m ModuleKeys) Prefix() string { return m.prefix }
