// Package rds is the Redis plumbing every Redis user of the service shares:
// the go-redis clients for DB0 and DB1 (NewRedis: a standalone client, or
// a Redis Cluster client for a URL with addr= seeds, both returned as
// redis.UniversalClient; a cluster client reloads its slot map when a node
// stops answering) and the routing of go-redis's own log lines into the
// service's JSON logger (SetRedisLogger), the sharing of round trips by
// concurrent callers (Batcher: script calls and realtime publishes in one
// pipeline, and calls nobody waits for gathered over a couple of
// milliseconds; on a cluster, pipelines of one master each, so a stalled
// master holds only its own slots' calls), the DB0 fast-failure state
// (RedisHealth), the fenced coordination locks (Locker), the rendering of
// the Redis ACL file (standalone or cluster node), the classification of
// Redis failures into stable sentinel errors (ClassifyRedisError) and Kind,
// the one classifier that names any error's class for logs and metrics
// without its text.
//
// It imports no database driver, so the realtime packages (presence,
// ratelimit, pubsub) use Redis without linking PostgreSQL; the PostgreSQL
// side is the parent package store, whose Kind adds PostgreSQL's error
// codes to this one.
//
// Every key the service writes carries a hash tag. The clients, Batcher,
// Locker and RedisHealth are safe for concurrent use.
package rds
