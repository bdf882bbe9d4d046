package gateway_test

import (
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// The counts a metrics scrape reads (connections, dialog subscriptions)
// take no lock of the hub: a flood of scrapes on an instance with many
// sockets held the hub's lock through walks of every connection, and every
// connect, subscribe and delivery waited behind them. With the lock held
// elsewhere the counts still come at once, and they follow connects,
// subscribes, unsubscribes and disconnects.
func TestStatsReadNoHubLock(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	u := in.users(2)
	alice, bob := u[0], u[1]
	d := in.dialog(alice, bob)
	a := in.connect(alice)
	a.subscribe(d)
	b := in.connect(bob)
	b.subscribe(d)
	b.send(`{"type":"unsubscribe","dialogId":"` + d + `"}`)
	b.send(`{"type":"ping"}`) // unsubscribe has no answer: the pong comes after it
	b.expect("pong")

	release := in.svc.HoldHubLock()
	got := make(chan gateway.Stats, 1)
	go func() { got <- in.svc.Stats() }()
	var st gateway.Stats
	select {
	case st = <-got:
		release()
	case <-time.After(5 * time.Second):
		release()
		t.Fatal("Stats waited for the hub's lock")
	}
	if st.Connections != 2 || st.Subscriptions != 1 {
		t.Fatalf("connections %d, subscriptions %d; want 2 and 1", st.Connections, st.Subscriptions)
	}
	a.ws.CloseNow()
	testenv.Eventually(t, 10*time.Second, func() bool { s := in.svc.Stats(); return s.Connections == 1 && s.Subscriptions == 0 },
		"the closed connection and its subscription still counted")
}
