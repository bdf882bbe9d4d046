package gateway_test

import (
	"context"
	"io"
	"net/http"
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

// DB1 down (docs/degraded-mode.md): tickets and presence answer 503, new
// connections are refused with 1013, existing sockets keep local fan-out,
// and they get resync when DB1 is back.
func TestRealtimeRedisOutage(t *testing.T) {
	db1, err := testenv.StartRedis(testenv.RedisOptions{SeparateInstances: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db1.Stop()
	pool := openPool(t)
	in := newInstance(t, pool, opts{rtURL: db1.URL(0)})
	u := in.users(2)
	a, b := u[0], u[1]
	d := in.dialog(a, b)
	cb := in.connect(b)
	cb.subscribe(d)

	db1.Kill()
	testenv.Eventually(t, 10*time.Second, func() bool { return !in.svc.PubSubHealthy() }, "the link loss went unnoticed")

	code, body := in.do(a, "POST", "/v1/realtime/tickets", "")
	if code != 503 || string(body) != `{"error":"redis_unavailable"}` {
		t.Fatalf("ticket during the outage: %d %s", code, body)
	}
	code, body = in.do(a, "GET", "/v1/users/"+b+"/presence", "")
	if code != 503 || string(body) != `{"error":"redis_unavailable"}` {
		t.Fatalf("presence during the outage: %d %s", code, body)
	}
	resp, err := http.Get(in.srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(ready), `"status":"degraded"`) || !strings.Contains(string(ready), `"pubsub":"down"`) {
		t.Fatalf("/readyz during the outage: %d %s", resp.StatusCode, ready)
	}
	refused := in.connectWith(dialOpts{token: token(t, a)})
	if got, _ := refused.closeStatus(10 * time.Second); got != gateway.CloseTryAgainLater {
		t.Fatalf("a new connection during the outage: close %d, want 1013", got)
	}

	// REST stays the truth and this instance's sockets still hear its own
	// events.
	m := in.post(a, d, "while DB1 is down")
	if f := cb.expect("event"); f.Seq != m.Seq || f.EntityID != m.ID {
		t.Fatalf("local fan-out: %s", f.raw)
	}

	if err := db1.Restart(); err != nil {
		t.Fatal(err)
	}
	if f := cb.expect("resync"); f.Reason != "pubsub_reconnect" {
		t.Fatalf("resync: %s", f.raw)
	}
	testenv.Eventually(t, 10*time.Second, in.svc.PubSubHealthy, "link did not come back")
	// The command pool notices the return on its own schedule (go-redis
	// retries dialing in the background after repeated failures).
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := in.do(a, "GET", "/v1/users/"+b+"/presence", "")
		return code == 200
	}, "presence still failing after DB1 came back")
	tk, _ := in.ticket(a)
	c := in.connectWith(dialOpts{ticket: tk, origin: testOrigin})
	c.expect("hello")
	// Cross-instance delivery works again.
	m = in.post(a, d, "after")
	for {
		f := cb.next(10 * time.Second)
		if f.Type == "event" && f.Seq == m.Seq {
			break
		}
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
	code, body := in.do(u, "GET", "/v1/users/"+u+"/presence", "")
	if code != 200 || !strings.Contains(string(body), `"online":false`) {
		t.Fatalf("presence after the drain: %d %s", code, body)
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
