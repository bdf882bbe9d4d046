package gateway_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// stallMembers holds a lock on dialog_members in a transaction that ends
// with the test (or at release): the membership check of every subscribe
// waits for it until SubscribeTimeout.
func stallMembers(t *testing.T, in *instance) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release = func() { _ = tx.Rollback(ctx) }
	t.Cleanup(release)
	if _, err := tx.Exec(ctx, "LOCK TABLE dialog_members IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return release
}

// A client that answers every ping at once stays connected while the
// server is slow with its frames: PostgreSQL stalls while it has a few
// subscribes in flight, each answered unavailable after SubscribeTimeout,
// and its pong waits in the socket behind them longer than PongTimeout.
func TestPongBehindSlowSubscribesKeepsTheClient(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.PingInterval = time.Second // the first ping comes 0.5–1 s after the connect
	}})
	u := in.users(2)
	var ds []string
	for range 3 {
		ds = append(ds, in.dialog(u[0], u[1]))
	}
	c := in.connect(u[1])
	release := stallMembers(t, in)
	for _, d := range ds {
		c.send(`{"type":"subscribe","dialogId":"` + d + `"}`)
	}
	// The client reads all along, so coder/websocket answers the
	// server's pings as they come.
	for i := range ds {
		if f := c.expect("error"); f.Error != "unavailable" {
			t.Fatalf("subscribe %d answered %s", i, f.raw)
		}
	}
	release()
	if seq := c.subscribe(ds[0]); seq != 0 {
		t.Fatalf("lastSeq %d of an empty dialog", seq)
	}
	c.send(`{"type":"ping"}`)
	c.expect("pong")
}

// A peer that never answers a ping is still dropped (its socket closed,
// no close frame) once the server is done with its frames: the subscribe
// it sent during a PostgreSQL stall is answered first, however long it
// took, and the pong it owes is then waited for PongTimeout.
func TestSilentPeerIsDroppedAfterItsSlowFrame(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.PingInterval, c.PongTimeout = 300*time.Millisecond, time.Second
		c.SubscribeTimeout = 3 * time.Second
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	rc := in.rawConnect(u[1]) // never answers a ping
	stallMembers(t, in)
	rc.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	answered := false
	for {
		_ = rc.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		op, p, err := readServerFrame(rc.br)
		if err != nil {
			if !answered {
				t.Fatalf("dropped before its subscribe was answered: %v", err)
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("a peer that does not answer pings is still connected 30 s after its last frame was answered")
			}
			break // the socket was closed: dropped
		}
		switch op {
		case 0x8:
			t.Fatalf("close frame %q: a peer dropped for its missing pong gets none", p)
		case 0x1:
			var f struct{ Type, Event, Error string }
			if err := json.Unmarshal(p, &f); err != nil {
				t.Fatal(err)
			}
			switch {
			case f.Type == "event" && f.Event == gateway.EventPresenceChanged:
			case !answered && f.Type == "error" && f.Error == "unavailable":
				answered = true
			default:
				t.Fatalf("unexpected frame %s", p)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().Connections == 0 }, "the silent peer is still counted")
}
