package pubsub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// Sharded Pub/Sub needs a Redis Cluster: on a standalone Redis the
// subscriber refuses the mode when it is built and the publisher refuses
// to publish, both with the sentinel that says so, rather than a silent
// fan-out that no instance hears.
func TestShardedModeRefusedOnStandalone(t *testing.T) {
	rdb := rtClient(t)
	_, err := pubsub.NewSubscriber(rdb, pubsub.SubscriberConfig{InstanceID: "sharded-" + ids.New()[24:], Mode: rds.PubSubSharded},
		discard, func(string, []byte) {}, nil)
	if !errors.Is(err, rds.ErrShardedNeedsCluster) {
		t.Fatalf("sharded subscriber on a standalone Redis: %v, want ErrShardedNeedsCluster", err)
	}
	err = pubsub.NewPublisher(rdb, rds.PubSubSharded, nil, nil).Publish(context.Background(), pubsub.DialogChannel(ids.New()), []byte("x"))
	if !errors.Is(err, rds.ErrShardedNeedsCluster) || rds.Kind(err) != "pubsub_mode" {
		t.Fatalf("sharded publish on a standalone Redis: %v (kind %s), want ErrShardedNeedsCluster", err, rds.Kind(err))
	}
}

// Classic, stated explicitly, is what a standalone Redis does anyway: a
// PUBLISH reaches the subscriber.
func TestClassicModeOnStandalone(t *testing.T) {
	rdb := rtClient(t)
	k := &sink{msgs: map[string][]string{}}
	s, err := pubsub.NewSubscriber(rdb, pubsub.SubscriberConfig{InstanceID: "classic-" + ids.New()[24:], Mode: rds.PubSubClassic},
		discard, k.message, k.resync)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	ch := pubsub.DialogChannel(ids.New())
	if err := s.Subscribe(context.Background(), ch); err != nil {
		t.Fatal(err)
	}
	if err := pubsub.NewPublisher(rdb, rds.PubSubClassic, nil, nil).Publish(context.Background(), ch, []byte("frame")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return k.count(ch) == 1 }, "the PUBLISH did not arrive")
}
