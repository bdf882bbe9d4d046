package project

import "time"

// Limits of the project Redis API (docs/project-redis-api.md). Each is
// defined here once: the handlers validate requests against them and the
// snapshot reports them, and the queue and the cache pass them to the
// scripts.
const (
	// CacheKeyMaxBytes is the longest relative cache key, in UTF-8 bytes.
	CacheKeyMaxBytes = 256
	// CacheTTLMinSeconds and CacheTTLMaxSeconds bound a cache entry's TTL
	// (1 s .. 30 days); CacheTTLDefaultSeconds applies when none is given.
	CacheTTLMinSeconds     = 1
	CacheTTLMaxSeconds     = 2592000
	CacheTTLDefaultSeconds = 86400
	// CachePageDefault and CachePageMax are the cache listing's page sizes;
	// CachePageMax also caps a topic message page. CachePageValueBytes caps
	// the values one cache page returns.
	CachePageDefault    = 50
	CachePageMax        = 100
	CachePageValueBytes = 4 << 20
	// CacheQuotaDefaultBytes is a new project's cache quota; an admin may
	// raise it up to CacheQuotaMaxBytes.
	CacheQuotaDefaultBytes = 1 << 20
	CacheQuotaMaxBytes     = 16 << 20
	// LegacyGrace is how long legacy entries live after the upgrade when
	// their container has no TTL: query time + 30 days while pending, write
	// time + 30 days once a PUT fixes it.
	LegacyGrace = 30 * 24 * time.Hour

	// TopicNameMaxBytes and TopicDescriptionMaxBytes bound a topic's name
	// and description; ProducerIDMaxBytes and ClientEventIDMaxBytes a
	// publish's dedupe identity; all in UTF-8 bytes.
	TopicNameMaxBytes        = 128
	TopicDescriptionMaxBytes = 1024
	ProducerIDMaxBytes       = 256
	ClientEventIDMaxBytes    = 256
	// MessagePageDefault is a topic message page when none is asked for.
	MessagePageDefault = 50
	// MessageMaxBytes is the largest message payload; ResultMaxBytes the
	// largest receipt result.
	MessageMaxBytes = 16 << 10
	ResultMaxBytes  = 256
	// ReceiptReserveBytes is what every receipt reserves of the budget at
	// publish time (it holds up to 10 token hashes and a ResultMaxBytes
	// result).
	ReceiptReserveBytes = 4096
	// ReceiptMaxAttempts is how many leases a receipt gets before it is
	// terminal `exhausted`.
	ReceiptMaxAttempts = 10
	// MessageOverheadBytes is what a message costs beyond its payload,
	// producerId and clientEventId (MessageBytes): its stream entry's id,
	// size, timestamp and charge and their framing, and its entry in the
	// topic's open HASH or done ZSET. Measured with MEMORY USAGE on Redis 7
	// (2,000 messages): 40..150 bytes of stream entry beyond the three
	// strings, 20..120 of index entry.
	MessageOverheadBytes = 256
	// DedupeRecordOverhead is what a dedupe record costs beyond its
	// identity (topic id, producerId, clientEventId), which it stores twice
	// (the dd HASH field and the ddx ZSET member; DedupeRecordBytes): its
	// ~150-byte JSON value (message id, fingerprint, timestamps, sizes) and
	// the HASH and ZSET entries' framing. Measured with MEMORY USAGE on
	// Redis 7 (2,000 records): 300..480 bytes beyond the two identities,
	// about 320 but for the longest ones, whose allocations round up.
	DedupeRecordOverhead = 320
	// ClaimCountMin and ClaimCountMax bound how many messages one claim asks
	// for.
	ClaimCountMin = 1
	ClaimCountMax = 20

	// ProjectBudgetBytes is one project's reliable bytes (messages,
	// receipts, dedupe records); ModuleBudgetBytes those of every project
	// together. QueueConfig may lower them (tests do).
	ProjectBudgetBytes = 2 << 20
	ModuleBudgetBytes  = 64 << 20
	// LeaseDefault is how long a claim holds a message; DedupeWindowDefault
	// how long a publish's identity is remembered.
	LeaseDefault        = 60 * time.Second
	DedupeWindowDefault = 24 * time.Hour
	// MaxTopicsDefault and MaxSubscriptionsDefault cap what one project
	// holds (409 budget_exhausted beyond).
	MaxTopicsDefault        = 256
	MaxSubscriptionsDefault = 256
)
