package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// typing {dialogId} becomes an ephemeral event to the dialog, at most one
// per connection and dialog per TypingInterval.
func TestTypingIsRateLimited(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) { c.TypingInterval = time.Hour }})
	u := in.users(2)
	a, b := u[0], u[1]
	d := in.dialog(a, b)
	ca, cb := in.connect(a), in.connect(b)
	ca.subscribe(d)
	cb.subscribe(d)
	for i := 0; i < 5; i++ {
		ca.send(`{"type":"typing","dialogId":"` + d + `"}`)
	}
	ca.send(`{"type":"ping"}`)
	ca.expect("pong") // every typing frame has been handled
	m := in.post(a, d, "typed")
	typing := 0
	for {
		f := cb.next(10 * time.Second)
		if f.Type != "event" {
			t.Fatalf("unexpected %s", f.raw)
		}
		if f.Event == gateway.EventTyping {
			typing++
			var data struct {
				UserID string `json:"userId"`
			}
			if err := json.Unmarshal(f.Data, &data); err != nil || data.UserID != a || f.EntityID != a || f.DialogID != d ||
				f.Channel != "dialog:"+d || strings.Contains(string(f.raw), `"seq"`) {
				t.Fatalf("typing event: %s", f.raw)
			}
		}
		if f.Event == "message.created" && f.Seq == m.Seq {
			break
		}
	}
	if typing != 1 {
		t.Fatalf("b saw %d typing events, want 1 (rate limited)", typing)
	}
	if st := in.svc.Stats(); st.TypingDrops != 4 {
		t.Fatalf("typing drops: %d, want 4", st.TypingDrops)
	}
}

// Drain closes every socket with 1001 and a reconnect delay in the close
// reason, removes their presence, and refuses new connections with 1001.
func TestDrainClosesWithRetryDelay(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) {
		c.DrainBatch, c.RetryMin, c.RetryMax = 2, 700*time.Millisecond, 900*time.Millisecond
	}})
	u := in.users(1)[0]
	var cs []*client
	for i := 0; i < 5; i++ {
		cs = append(cs, in.connect(u))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := in.svc.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		code, reason := c.closeStatus(10 * time.Second)
		var v struct {
			RetryMs *int64 `json:"retryMs"`
		}
		if code != websocket.StatusGoingAway || json.Unmarshal([]byte(reason), &v) != nil || v.RetryMs == nil ||
			*v.RetryMs < 700 || *v.RetryMs > 900 || len(reason) > 123 {
			t.Fatalf("drain close: %d %q", code, reason)
		}
	}
	if n := in.svc.Stats().Connections; n != 0 {
		t.Fatalf("%d connections left after the drain", n)
	}
	if n, err := in.svc.OnlineConnections(context.Background(), u); err != nil || n != 0 {
		t.Fatalf("presence after the drain: %d connections (%v), want offline", n, err)
	}
	late := in.connectWith(dialOpts{token: token(t, u)})
	if code, _ := late.closeStatus(10 * time.Second); code != websocket.StatusGoingAway {
		t.Fatalf("a connection during the drain: %d", code)
	}
}

// WebSocket ping/pong liveness: a peer that does not answer pings is
// dropped; a normal client (coder/websocket answers pings while reading)
// stays.
func TestPingLiveness(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) {
		c.PingInterval, c.PongTimeout = 100*time.Millisecond, 300*time.Millisecond
	}})
	u := in.users(1)[0]
	good := in.connect(u)
	mute := in.rawConnect(u) // reads, never answers a ping
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		var h [2]byte
		for {
			_ = mute.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := mute.br.Read(h[:1]); err != nil {
				return
			}
		}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().Connections == 1 }, "the mute peer was not dropped")
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the mute peer's socket is still open")
	}
	good.send(`{"type":"ping"}`)
	good.expect("pong")
}

func TestSubscriptionLimit(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) { c.MaxSubscriptions = 2 }})
	u := in.users(1)[0]
	c := in.connect(u)
	d1, d2, d3 := in.dialog(u), in.dialog(u), in.dialog(u)
	c.subscribe(d1)
	c.subscribe(d2)
	c.subscribe(d2) // a repeat is answered again and is not a new subscription
	c.send(`{"type":"subscribe","dialogId":"` + d3 + `"}`)
	if f := c.expect("error"); f.Error != "too_many_subscriptions" {
		t.Fatalf("%s", f.raw)
	}
	c.send(`{"type":"unsubscribe","dialogId":"` + d1 + `"}`)
	c.subscribe(d3)
	if st := in.svc.Stats(); st.Subscriptions != 2 {
		t.Fatalf("subscriptions: %d", st.Subscriptions)
	}
}
