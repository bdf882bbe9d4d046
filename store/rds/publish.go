package rds

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// PubSubMode is how realtime channels travel on the realtime Redis: sharded
// Pub/Sub (SSUBSCRIBE/SPUBLISH, one subscriber connection per master of a
// Redis Cluster, each message handled only by the shard that owns the
// channel's slot) or classic Pub/Sub (SUBSCRIBE/PUBLISH on one connection;
// on a Redis Cluster every PUBLISH is forwarded over the cluster bus to
// every node). Every publisher and subscriber of a deployment must use the
// same mode: a PUBLISH never reaches an SSUBSCRIBE and the other way round.
type PubSubMode uint8

const (
	// PubSubAuto, the zero value: sharded on a Redis Cluster client,
	// classic on a standalone one.
	PubSubAuto PubSubMode = iota
	// PubSubSharded: sharded Pub/Sub; needs a Redis Cluster client.
	PubSubSharded
	// PubSubClassic: classic Pub/Sub, also on a Redis Cluster.
	PubSubClassic
)

// ErrShardedNeedsCluster is returned for sharded Pub/Sub on a client of a
// standalone Redis.
var ErrShardedNeedsCluster = Named("pubsub_mode", "sharded Pub/Sub needs a Redis Cluster (a URL with addr= parameters); this one is a standalone Redis: use auto or classic")

// String is the mode's name as ParsePubSubMode reads it.
func (m PubSubMode) String() string {
	switch m {
	case PubSubSharded:
		return "sharded"
	case PubSubClassic:
		return "classic"
	default:
		return "auto"
	}
}

// ParsePubSubMode reads "auto" (or ""), "sharded" or "classic".
func ParsePubSubMode(s string) (PubSubMode, error) {
	switch s {
	case "", "auto":
		return PubSubAuto, nil
	case "sharded":
		return PubSubSharded, nil
	case "classic":
		return PubSubClassic, nil
	}
	return PubSubAuto, errors.New("must be auto, sharded or classic")
}

// ShardedPubSub reports whether realtime channels on rdb use sharded
// Pub/Sub under mode; sharded on a standalone client is
// ErrShardedNeedsCluster.
func ShardedPubSub(rdb redis.UniversalClient, mode PubSubMode) (bool, error) {
	_, cluster := rdb.(*redis.ClusterClient)
	switch mode {
	case PubSubAuto:
		return cluster, nil
	case PubSubSharded:
		if !cluster {
			return false, ErrShardedNeedsCluster
		}
		return true, nil
	case PubSubClassic:
		return false, nil
	}
	return false, fmt.Errorf("unknown Pub/Sub mode %d", mode)
}

// Publish sends payload on a realtime channel the way the subscribers of
// mode listen: SPUBLISH when realtime channels are sharded (the message
// goes to the shard that owns the channel's slot, not to every node),
// PUBLISH otherwise. Every publisher of realtime channels goes through
// here or through Batcher.Publish.
func Publish(ctx context.Context, rdb redis.UniversalClient, mode PubSubMode, channel string, payload []byte) *redis.IntCmd {
	sharded, err := ShardedPubSub(rdb, mode)
	if err != nil {
		cmd := redis.NewIntCmd(ctx, "spublish", channel, payload)
		cmd.SetErr(err)
		return cmd
	}
	return publishOn(ctx, rdb, sharded, channel, payload)
}

// publishOn runs (on a client) or queues (on a pipeline) the publish.
func publishOn(ctx context.Context, c lua.Processor, sharded bool, channel string, payload []byte) *redis.IntCmd {
	if sharded {
		return publishOnce(ctx, c, "spublish", channel, payload)
	}
	return publishOnce(ctx, c, "publish", channel, payload)
}

// oncePublish is a publish go-redis never sends a second time: one sent
// again after a read timeout would reach every subscriber twice when
// Redis was only slow (see lua.Script.Run). An unanswered publish is the
// caller's to handle; the outbox relay sends its event again, and a
// client drops an event id it has seen.
type oncePublish struct{ *redis.IntCmd }

func (oncePublish) NoRetry() bool { return true }

// publishOnce builds PUBLISH or SPUBLISH (the channel as its key, for a
// cluster client's routing) and processes it once.
func publishOnce(ctx context.Context, c lua.Processor, name, channel string, payload []byte) *redis.IntCmd {
	return lua.SendOnce(ctx, func() *redis.IntCmd {
		cmd := redis.NewIntCmd(ctx, name, channel, payload)
		cmd.SetFirstKeyPos(1)
		_ = c.Process(ctx, oncePublish{cmd})
		return cmd
	})
}
