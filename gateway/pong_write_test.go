package gateway_test

import (
	"net"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
)

// writeControl sends one masked control frame (op: 0x9 ping, 0xA pong)
// with payload p.
func (rc *rawClient) writeControl(op byte, p []byte) {
	rc.t.Helper()
	mask := [4]byte{5, 6, 7, 8}
	b := append([]byte{0x80 | op, 0x80 | byte(len(p))}, mask[:]...)
	for i, c := range p {
		b = append(b, c^mask[i%4])
	}
	if _, err := rc.nc.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

// nextText reads the server's frames, answering each ping at once with
// its pong, up to the next text frame, which it returns decoded. A read
// error (the socket closed) fails the test with what.
func (rc *rawClient) nextText(what string) frame {
	rc.t.Helper()
	for {
		_ = rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		op, p, err := readServerFrame(rc.br)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				rc.t.Fatalf("%s: nothing for 10 s", what)
			}
			rc.t.Fatalf("%s: the connection ended: %v", what, err)
		}
		switch op {
		case 0x9:
			rc.writeControl(0xA, p)
		case 0x8:
			rc.t.Fatalf("%s: close frame %q", what, p)
		case 0x1:
			var f frame
			if err := json.Unmarshal(p, &f); err != nil {
				rc.t.Fatal(err)
			}
			f.raw = p
			return f
		}
	}
}

// A client slow to take a burst, within the write timeout, is not dropped
// for a pong it could not have sent: the server's ping waits behind the
// batch it is writing, and the wait for its pong counts from the ping's
// write. The client here takes nothing for several times PongTimeout
// while a burst fills its socket, then reads everything, answering each
// ping at once: it gets every event and stays connected.
func TestPongWaitCountsFromThePingsWrite(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.PingInterval, c.PongTimeout = 200*time.Millisecond, 500*time.Millisecond
		c.WriteTimeout, c.SendBuffer, c.QueueFrames = 10*time.Second, 32<<10, 1024
	}})
	u := in.users(1)
	d := in.dialog(u...)
	rc := in.rawConnect(u[0]) // small receive buffer
	rc.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	for {
		if f := rc.nextText("subscribe"); f.Type == "subscribed" {
			break
		}
	}
	const events = 100
	for i := range events {
		publishEvent(t, in, d, int64(i+1), 8<<10)
	}
	// Far more than the socket buffers hold: the writer's batch waits for
	// the client, which takes nothing for 6 × PongTimeout (well within
	// the write timeout).
	time.Sleep(3 * time.Second)
	for got := 0; got < events; {
		f := rc.nextText("reading the burst")
		if f.Type == "event" && f.Event != gateway.EventPresenceChanged {
			got++
		}
	}
	rc.write(`{"type":"ping"}`)
	for rc.nextText("after the burst").Type != "pong" {
	}
	if n := in.svc.Stats().Connections; n != 1 {
		t.Fatalf("%d connections, want the slow reader's", n)
	}
}
