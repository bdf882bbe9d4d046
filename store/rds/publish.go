package rds

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Publish sends payload on a realtime channel the way the subscribers
// listen: SPUBLISH on a Redis Cluster (the message goes to the shard that
// owns the channel's slot, not to every node), PUBLISH on a standalone
// Redis. Every publisher of realtime channels goes through here or through
// Batcher.Publish, since a PUBLISH never reaches an SSUBSCRIBE and the
// other way round.
func Publish(ctx context.Context, rdb redis.UniversalClient, channel string, payload []byte) *redis.IntCmd {
	return publishOn(ctx, rdb, shardedPubSub(rdb), channel, payload)
}

// shardedPubSub reports whether realtime channels on rdb use sharded
// Pub/Sub.
func shardedPubSub(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.ClusterClient)
	return ok
}

// publishOn runs (on a client) or queues (on a pipeline) the publish.
func publishOn(ctx context.Context, c redis.Cmdable, sharded bool, channel string, payload []byte) *redis.IntCmd {
	if sharded {
		return c.SPublish(ctx, channel, payload)
	}
	return c.Publish(ctx, channel, payload)
}
