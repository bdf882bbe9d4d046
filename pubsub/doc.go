// Package pubsub is the cross-instance fan-out over Redis Pub/Sub: channel
// names, the realtime event frame that is published byte-for-byte as clients
// receive it, and (with the realtime gateway) the per-instance multiplexed
// subscriber. Pub/Sub is at-most-once: PostgreSQL stays the truth and clients
// reconcile over REST after every reconnect.
//
// Event values are plain data and safe to share once built.
package pubsub
