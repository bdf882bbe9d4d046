package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// A Redis that stalls instead of failing runs the calls it already received
// when it wakes. A handshake whose presence registration timed out is
// refused with 1013 and its registration taken back at once — but the
// stalled registration may run after that removal, and the refused
// connection would then hold one of the user's slots, the user shown online,
// until it went stale (90 s). The registration is removed once more shortly
// after Redis answers: the user's connection set is empty again within
// seconds, and the user connects.
func TestStalledRegistrationIsTakenBack(t *testing.T) {
	r, admin := privateRedis(t)
	in := newInstance(t, openPool(t), opts{rtURL: r.URL(1), presence: func(c *presence.Config) {
		c.RetakeAfter = 2 * time.Second
	}})
	users := in.users(2)
	user := users[1]
	// A first connection loads the scripts, so the stalled call is the
	// EVALSHA a running service sends.
	in.connect(users[0])

	// The witness that the stalled registration ran when Redis woke: the
	// ZADD to the user's connection set, whichever of it and the removals
	// Redis ran first (they may travel on different connections).
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "notify-keyspace-events", "Kz").Err(); err != nil {
		t.Fatal(err)
	}
	events := admin.Subscribe(ctx, fmt.Sprintf("__keyspace@%d__:%s", admin.Options().DB, presence.UserConnsKey(user)))
	t.Cleanup(func() { events.Close() })
	if _, err := events.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// Handshaken connections only: a registration taken from a connection
	// the pool dialled while Redis was stopped never reaches Redis.
	testenv.WarmPool(t, in.rt)

	thaw := r.Freeze(t)
	c := in.connectWith(dialOpts{token: token(t, user)})
	if code, reason := c.closeStatus(10 * time.Second); code != gateway.CloseTryAgainLater {
		t.Fatalf("closed with %d %q, want 1013", code, reason)
	}
	thaw()
	added := false
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for !added {
		m, err := events.ReceiveMessage(wctx)
		if err != nil {
			t.Fatalf("the stalled registration never ran (%v): the test does not show what it means to", err)
		}
		added = m.Payload == "zadd"
	}
	conns := func() int64 { return admin.ZCard(ctx, presence.UserConnsKey(user)).Val() }
	testenv.Eventually(t, 10*time.Second, func() bool {
		return conns() == 0 && admin.Exists(ctx, presence.OnlineKey(user)).Val() == 0
	}, "the stalled registration still holds a slot and the online marker")
	in.connect(user)
}
