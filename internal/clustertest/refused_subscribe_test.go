package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A master that refuses one SSUBSCRIBE (CLUSTERDOWN: the channel's slot is
// not served) refuses that command alone: the SSUBSCRIBEs written after it
// on the same shard connection are carried out, and their confirmations
// arrive after the refusal. The subscriber's view must follow the
// server's: those channels are confirmed (their subscribes are answered)
// and, once nobody holds them, unsubscribed, so the master is left with no
// subscription the instance does not know of. Taking every unconfirmed
// channel of the connection for refused left them subscribed on the
// master while their callers were told the subscribe failed, and a
// channel dropped then was never unsubscribed.
func TestARefusedSubscribeLeavesTheOthersOnItsConnectionConfirmed(t *testing.T) {
	c := ownCluster(t, testenv.ClusterOptions{NodeTimeout: 15 * time.Second})
	ctx := context.Background()
	// A long retry backoff: a channel taken for refused is subscribed
	// again only seconds later, long after its caller gave up.
	r := subscriberWithConfig(t, c, pubsub.SubscriberConfig{InstanceID: "inst-refused",
		CanaryInterval: time.Second, ReconnectMin: 4 * time.Second, ReconnectMax: 8 * time.Second})
	testenv.Eventually(t, 10*time.Second, r.sub.Healthy, "subscriber never came up")
	victim := masterWithoutCanary(t, c, "inst-refused")
	chs := channelsByMaster(t, c, 24)[victim.Addr()]
	up, refused := chs[0], chs[1]
	var others []string
	for _, ch := range chs[2:] {
		if testenv.Slot(ch) != testenv.Slot(refused) {
			others = append(others, ch)
		}
	}
	r.subscribe(t, up) // the victim's shard connection is up

	admin := victim.AdminClient(0)
	defer admin.Close()
	slot := testenv.Slot(refused)
	if err := admin.Do(ctx, "cluster", "delslots", slot).Err(); err != nil {
		t.Fatal(err)
	}
	// The refused channel's SSUBSCRIBE is written first, the others' after
	// it; the frozen master answers them all, in that order, once thawed.
	thaw := victim.Freeze(t)
	refusedErr := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		refusedErr <- r.sub.Subscribe(sctx, refused)
	}()
	time.Sleep(300 * time.Millisecond)
	deadline := time.Now().Add(1300 * time.Millisecond) // 1 s after the thaw
	errs := make(chan error, len(others))
	for _, ch := range others {
		go func() {
			sctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			errs <- r.sub.Subscribe(sctx, ch)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	thaw()

	failed := 0
	for range others {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if err := <-refusedErr; err == nil {
		t.Fatal("a subscribe of a channel whose slot is not served was answered")
	}
	if err := admin.Do(ctx, "cluster", "addslots", slot).Err(); err != nil {
		t.Fatal(err)
	}
	if failed > 0 {
		t.Errorf("%d of %d subscribes written after the refused one failed, though the master carried them out", failed, len(others))
	}
	for _, ch := range others {
		r.sub.Unsubscribe(ch)
	}
	r.sub.Unsubscribe(up)
	held := func(ch string) int64 {
		n, err := admin.PubSubShardNumSub(ctx, ch).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[ch]
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, ch := range append([]string{up, refused}, others...) {
			if held(ch) != 0 {
				return false
			}
		}
		return true
	}, "the master still holds subscriptions nobody on the instance holds")
}
