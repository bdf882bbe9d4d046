package scenarios

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store/rds"
)

// publisher puts an event frame on a dialog's channel.
type publisher interface {
	Publish(ctx context.Context, channel string, frame []byte) error
	Close() error
}

// redisPublisher publishes (SPUBLISH on a cluster unless -pubsub-mode
// says classic) straight into Redis Pub/Sub, where every gateway
// instance subscribed to the dialog's channel picks the frame up and forwards
// its bytes unchanged: the gateway's fan-out is measured without the REST send
// path. Centrifugo is fed the same way, with its Redis engine's publication
// messages on its own channels. A cluster URL (addr= seeds) publishes
// through a cluster client, as the gateway does.
type redisPublisher struct {
	c    redis.UniversalClient
	mode rds.PubSubMode
}

func newRedisPublisher(ctx context.Context, rawURL string, mode rds.PubSubMode, pool int) (*redisPublisher, error) {
	if rawURL == "" {
		return nil, errors.New("broadcast publishes straight into Redis Pub/Sub: the gateway target needs -redis-url (or REDIS_REALTIME_URL), the centrifugo target -redis-url (or " + envCentrifugoRedisURL + ")")
	}
	if _, err := loadtest.CheckLoopbackURL(rawURL); err != nil {
		return nil, err
	}
	c, err := rds.NewRedis(rawURL, rds.RedisConfig{PoolSize: pool, ClientName: "han-loadtest",
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("bad -redis-url: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	if _, err := rds.ShardedPubSub(c, mode); err != nil {
		c.Close()
		return nil, fmt.Errorf("-pubsub-mode: %w", err)
	}
	return &redisPublisher{c: c, mode: mode}, nil
}

func (p *redisPublisher) Publish(ctx context.Context, channel string, frame []byte) error {
	return rds.Publish(ctx, p.c, p.mode, channel, frame).Err()
}

func (p *redisPublisher) Close() error { return p.c.Close() }

// baselinePublisher sends "<channel>\n<frame>" messages over a few
// WebSockets to the baseline's /publish endpoint.
type baselinePublisher struct {
	conns []*websocket.Conn
	next  atomic.Uint64
	buf   chan []byte // reusable message buffers
}

func newBaselinePublisher(ctx context.Context, t *loadtest.T, base string, n int) (*baselinePublisher, error) {
	p := &baselinePublisher{buf: make(chan []byte, 256)}
	client := loadtest.NewHTTPClient(t.Src, n, 0)
	client.Timeout = 0
	defer client.CloseIdleConnections()
	for range n {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, _, err := websocket.Dial(dctx, "ws"+base[len("http"):]+"/publish", &websocket.DialOptions{HTTPClient: client})
		cancel()
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("baseline publisher: %w", err)
		}
		p.conns = append(p.conns, c)
	}
	return p, nil
}

func (p *baselinePublisher) Publish(ctx context.Context, channel string, frame []byte) error {
	var b []byte
	select {
	case b = <-p.buf:
	default:
	}
	b = append(append(append(b[:0], channel...), '\n'), frame...)
	c := p.conns[p.next.Add(1)%uint64(len(p.conns))]
	err := c.Write(ctx, websocket.MessageText, b)
	select {
	case p.buf <- b:
	default:
	}
	return err
}

// Close drops the publish sockets without a close handshake: every event
// was written already, the baseline reads them until EOF, and a handshake
// would wait up to 5 s per socket on a target that stopped answering.
func (p *baselinePublisher) Close() error {
	for _, c := range p.conns {
		_ = c.CloseNow()
	}
	return nil
}

// errInjectedFailure is the error of a publish failingPublisher reports
// failed.
var errInjectedFailure = errors.New("publish reported failed by -fault-fail-publish-every")

// failingPublisher sends every publish but reports every n-th failed, as
// a timeout after the target had taken the event would: the generator
// does not expect that event, yet subscribers get it.
type failingPublisher struct {
	publisher
	every uint64
	n     atomic.Uint64
}

func (p *failingPublisher) Publish(ctx context.Context, channel string, frame []byte) error {
	if err := p.publisher.Publish(ctx, channel, frame); err != nil {
		return err
	}
	if p.n.Add(1)%p.every == 0 {
		return errInjectedFailure
	}
	return nil
}
