package rds

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Publish sends payload on a realtime channel the way the subscribers
// listen: SPUBLISH on a Redis Cluster (the message goes to the shard that
// owns the channel's slot, not to every node), PUBLISH on a standalone
// Redis. Every publisher of realtime channels goes through here, since a
// PUBLISH never reaches an SSUBSCRIBE and the other way round.
func Publish(ctx context.Context, rdb redis.UniversalClient, channel string, payload []byte) *redis.IntCmd {
	if _, ok := rdb.(*redis.ClusterClient); ok {
		return rdb.SPublish(ctx, channel, payload)
	}
	return rdb.Publish(ctx, channel, payload)
}
