// Package pubsub is the cross-instance fan-out over Redis Pub/Sub: channel
// names, the realtime event frame that is published byte-for-byte as
// clients receive it, the per-instance multiplexed Subscriber (reference
// counted channels, a Receive loop that notices a dropped link, jittered
// reconnects with one batched resubscribe, a canary; on a Redis Cluster
// sharded Pub/Sub with one connection per master, unless the mode,
// rds.PubSubMode, is classic), the Publisher (with
// local fan-out when Redis cannot carry a frame back) and the outbox Relay.
// Pub/Sub is at-most-once: PostgreSQL stays the truth and clients reconcile
// over REST after every reconnect.
//
// Event values are plain data and safe to share once built; Subscriber,
// Publisher and Relay are safe for concurrent use, and Close stops and
// waits for their goroutines.
package pubsub
