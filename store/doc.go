// Package store is the data access of the service: PostgreSQL (the source of
// truth: users, dialogs, messages with per-dialog seq, idempotency records,
// the outbox, projects, attachments, internal inbox receipts) through a pgx
// pool, the attachment blob store (BlobStore, LocalBlobs), the DB0
// fast-failure state (RedisHealth), the idempotency scripts' data access,
// the embedded SQL migrations, the go-redis clients for DB0 and DB1, the
// classification of Redis failures into stable sentinel errors, and the
// rendering of the Redis ACL file.
//
// Redis clients are returned as redis.UniversalClient so a Cluster client can
// replace a standalone one; every key the service writes carries a hash tag.
//
// Store and the clients are safe for concurrent use.
package store
