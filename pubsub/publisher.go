package pubsub

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// Publisher publishes event frames on Redis Pub/Sub. When Redis cannot
// carry a frame back to this instance's own sockets — the PUBLISH failed,
// or this instance's Pub/Sub link is down — it hands the frame to local as
// well, so sockets on the publishing instance keep getting events while
// DB1 is out (docs/degraded-mode.md). Such a frame may later arrive again (outbox
// relay, link recovery); clients dedupe by event id. Safe for concurrent
// use.
type Publisher struct {
	rdb   *rds.Batcher // publishes of concurrent senders share round trips
	mode  rds.PubSubMode
	sub   *Subscriber
	local func(channel string, payload []byte)
}

// NewPublisher returns a publisher on the DB1 client that publishes the way
// subscribers of mode listen (the subscribers' SubscriberConfig.Mode); sub
// and local may be nil (no local fallback).
func NewPublisher(rdb redis.UniversalClient, mode rds.PubSubMode, sub *Subscriber, local func(channel string, payload []byte)) *Publisher {
	return &Publisher{rdb: rds.NewBatcher(rdb), mode: mode, sub: sub, local: local}
}

// Publish sends payload on channel; the error is classified by
// rds.ClassifyRedisError.
func (p *Publisher) Publish(ctx context.Context, channel string, payload []byte) error {
	err := rds.ClassifyRedisError(p.rdb.Publish(ctx, p.mode, channel, payload).Err())
	if p.local != nil && (err != nil || (p.sub != nil && !p.sub.Healthy())) {
		p.local(channel, payload)
	}
	return err
}

// PublishLater is Publish for a caller that does not wait for the round
// trip: the publish joins the next shared pipeline of such calls, sent
// within a couple of milliseconds (rds.Batcher.PublishLater). done, if not
// nil, gets Publish's error once it is known, after the local fallback ran.
func (p *Publisher) PublishLater(channel string, payload []byte, done func(error)) {
	p.rdb.PublishLater(p.mode, channel, payload, func(err error) {
		err = rds.ClassifyRedisError(err)
		if p.local != nil && (err != nil || (p.sub != nil && !p.sub.Healthy())) {
			p.local(channel, payload)
		}
		if done != nil {
			done(err)
		}
	})
}

// Close sends the publishes PublishLater queued and waits for them; later
// ones fail at once (their events stay pending for the outbox relay).
func (p *Publisher) Close() { p.rdb.Close() }
