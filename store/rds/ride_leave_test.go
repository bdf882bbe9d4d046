package rds_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// A publish nobody waits for (PublishLater: the REST send's publish after
// commit, an idempotency complete) that rides on a pipeline of waited-for
// calls does not fail because those callers left. A shared pipeline ends
// once every caller waiting for it has left, but the rides are not among
// them: with rides on board it runs to its deadline. Here the only
// connection is busy for 1.5 s (a slow command; a stalled Redis), the
// waited-for caller leaves after 200 ms (a client hung up), and the ride
// goes out once the connection is free.
func TestARideGoesOutWhenTheWaitedForCallerLeaves(t *testing.T) {
	opt, err := redis.ParseURL(env.Redis.AdminURL(3))
	if err != nil {
		t.Fatal(err)
	}
	opt.PipelinePoolSize, opt.PoolSize, opt.MaxActiveConns, opt.PoolTimeout, opt.ReadTimeout = 1, 1, 1, 5*time.Second, 5*time.Second
	c := redis.NewClient(opt)
	defer c.Close()
	b := rds.NewBatcher(c)
	defer b.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	blpop := make(chan error, 1)
	go func() { blpop <- c.BLPop(ctx, 1500*time.Millisecond, "han:rt:test:ride-nokey").Err() }() // holds the one connection
	defer func() { t.Logf("blpop: %v", <-blpop) }()
	go c.Pipelined(ctx, func(p redis.Pipeliner) error { // holds the pipeline pool's one connection
		p.BLPop(ctx, 1500*time.Millisecond, "han:rt:test:ride-nokey2")
		return nil
	})
	time.Sleep(100 * time.Millisecond)

	rideErr := make(chan error, 1)
	b.PublishLater(rds.PubSubClassic, "han:rt:test:ride", []byte("later"), func(err error) { rideErr <- err })
	cctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() { waited <- b.Publish(cctx, rds.PubSubClassic, "han:rt:test:ride", []byte("waited")).Err() }()
	time.Sleep(200 * time.Millisecond)
	cancel() // the waited-for caller leaves
	t.Logf("waited-for publish: %v", <-waited)
	select {
	case err := <-rideErr:
		st := b.LaterStats()
		if err != nil {
			t.Fatalf("the ride (rides so far: %d) failed: %v; it should have gone out once the connection was free", st.Rides, err)
		}
		t.Logf("ride ok (rides: %d)", st.Rides)
	case <-time.After(5 * time.Second):
		t.Fatal("ride never answered")
	}
}
