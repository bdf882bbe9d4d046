package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
)

// subscribeHoldRig is an instance whose DB1 traffic passes a faultproxy,
// so a test can hold back the SUBSCRIBE of one user's channel on the
// instance's Pub/Sub connection while presence and every other command go
// through.
func subscribeHoldRig(t *testing.T) (*instance, *faultproxy.Proxy) {
	t.Helper()
	proxy, err := faultproxy.Start(env.Redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	rtURL := strings.Replace(env.Redis.URL(1), env.Redis.Addr(), proxy.Addr(), 1)
	return newInstance(t, openPool(t), opts{rtURL: rtURL}), proxy
}

// publishToUser publishes a user-addressed event on the user's channel
// straight to Redis, as the outbox relay or an inbox post would, and
// returns its id.
func publishToUser(t *testing.T, userID string) string {
	t.Helper()
	id := ids.New()
	payload, err := pubsub.Event{Type: "event", Channel: "user:" + userID, ID: id, Event: "inbox.note",
		EntityID: ids.New(), Data: []byte(`{}`)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.Publish(context.Background(), pubsub.UserChannel(userID), payload).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// A user's first socket on an instance reconciles over REST when its hello
// arrives, so an event published on the user's channel after that must
// reach the socket: hello waits until Redis has confirmed the instance's
// subscription to the channel. Here the SUBSCRIBE is held on its way to
// Redis for a while, as on a slow link.
func TestEventAfterHelloReachesAFirstSocket(t *testing.T) {
	in, proxy := subscribeHoldRig(t)
	u := in.users(1)[0]
	held, release := proxy.HoldRequest([]byte(pubsub.UserChannel(u)))
	// The SUBSCRIBE goes on a while after it was held. The dial may wait
	// for it (the upgrade response leaves with hello), so the release
	// cannot wait for the dial.
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		select {
		case <-held:
		case <-stop:
			return
		}
		slow := time.NewTimer(300 * time.Millisecond)
		defer slow.Stop()
		select {
		case <-slow.C:
			release()
		case <-stop:
		}
	}()

	c := in.connect(u)
	id := publishToUser(t, u)
	f := c.expect("event")
	if f.ID != id || f.Channel != "user:"+u {
		t.Fatalf("got %s, want the event %s of the user's channel", f.raw, id)
	}
}

// A Pub/Sub link that never confirms the user's channel: the socket gets
// no hello but, once the handshake's budget is spent, 1013 try again later
// (the refusal of a dependency that is unavailable); its presence
// registration is taken back and the instance keeps nothing of it. Once
// the link answers, the user connects.
func TestUnconfirmedUserChannelRefusesTheSocket(t *testing.T) {
	in, proxy := subscribeHoldRig(t)
	u := in.users(1)[0]
	held, release := proxy.HoldRequest([]byte(pubsub.UserChannel(u)))
	t.Cleanup(release)
	c := in.connectWith(dialOpts{token: token(t, u)})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the instance never sent the SUBSCRIBE of the user's channel")
	}
	code, reason := c.closeStatus(20 * time.Second)
	if code != gateway.CloseTryAgainLater || reason != "try again later" {
		t.Fatalf("closed with %d %q, want 1013 try again later", code, reason)
	}
	select {
	case f := <-c.frames:
		t.Fatalf("a refused socket got %s", f.raw)
	default:
	}
	if n, err := in.svc.OnlineConnections(context.Background(), u); err != nil || n != 0 {
		t.Fatalf("presence after the refusal: %d connections (%v), want none", n, err)
	}
	st := in.svc.Stats()
	if st.Connections != 0 || st.HandshakesActive != 0 || st.Rejects["pubsub_unavailable"] != 1 {
		t.Fatalf("after the refusal: %d connections, %d handshakes active, rejects %v", st.Connections, st.HandshakesActive, st.Rejects)
	}

	release()
	later := in.connect(u)
	id := publishToUser(t, u)
	if f := later.expect("event"); f.ID != id {
		t.Fatalf("got %s, want the event %s", f.raw, id)
	}
}

// An instance shut down while a first socket waits for its user channel's
// subscription: the wait ends with the drain, the socket is refused with
// 1001 like any handshake a drain meets, and the shutdown deregisters the
// instance only after the handshake took its presence registration back.
// Nothing of the socket is left in Redis: no registration of the user, no
// index entry of an instance that is no longer listed.
func TestShutdownWaitsForAHandshakeWaitingOnItsChannel(t *testing.T) {
	in, proxy := subscribeHoldRig(t)
	u := in.users(1)[0]
	held, release := proxy.HoldRequest([]byte(pubsub.UserChannel(u)))
	t.Cleanup(release)
	// The upgrade response leaves with hello or the refusal: dial aside.
	status := make(chan websocket.StatusCode, 1)
	tok := token(t, u)
	go func() {
		ws, _, err := in.dialRaw(dialOpts{token: tok})
		if err != nil {
			status <- -1
			return
		}
		defer ws.CloseNow()
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				status <- websocket.CloseStatus(err)
				return
			}
		}
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the instance never sent the SUBSCRIBE of the user's channel")
	}
	closed := make(chan struct{})
	go func() { in.svc.Close(); close(closed) }()
	select {
	case code := <-status:
		if code != gateway.CloseGoingAway {
			t.Fatalf("the waiting handshake closed with %d, want 1001", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting handshake was never closed")
	}
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the shutdown did not end")
	}
	ctx := context.Background()
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if n := admin.ZCard(ctx, presence.UserConnsKey(u)).Val(); n != 0 {
		t.Fatalf("the user still has %d registered connections after the shutdown", n)
	}
	listed := admin.ZScore(ctx, presence.InstancesKey, in.id).Err() == nil
	if idx := admin.ZRange(ctx, presence.InstanceConnsKey(in.id), 0, -1).Val(); len(idx) > 0 && !listed {
		t.Fatalf("the index holds %v for an instance no longer listed: no survivor would sweep it", idx)
	}
}
