package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// WebSocket opcodes with FIN set, as the first byte of a frame; a
// fragment that is not the last has FIN clear.
const (
	opText         = 0x81
	opPing         = 0x89
	opPong         = 0x8A
	opFirstOfText  = 0x01 // text, more fragments follow
	opContinuation = 0x00 // continuation, more fragments follow
	opLastFragment = 0x80 // continuation, the last fragment
)

// clientFrame is one masked client frame: first byte b0 (FIN + opcode)
// and payload (< 64 KiB).
func clientFrame(b0 byte, payload []byte) []byte {
	b := []byte{b0}
	if n := len(payload); n < 126 {
		b = append(b, 0x80|byte(n))
	} else {
		b = binary.BigEndian.AppendUint16(append(b, 0x80|126), uint16(n))
	}
	mask := []byte{9, 8, 7, 6}
	b = append(b, mask...)
	for i := range payload {
		b = append(b, payload[i]^mask[i%4])
	}
	return b
}

// fragmented is text split into n fragments (the last holds what is left).
func fragmented(text string, n int) []byte {
	var b []byte
	size := len(text) / n
	for i := range n {
		op := byte(opContinuation)
		switch {
		case i == 0 && n == 1:
			op = opText
		case i == 0:
			op = opFirstOfText
		case i == n-1:
			op = opLastFragment
		}
		part := text[i*size:]
		if i < n-1 {
			part = part[:size]
		}
		b = append(b, clientFrame(op, []byte(part))...)
	}
	return b
}

// serverFrames reads every frame the server sends to a raw client on a
// goroutine of its own: it counts pongs and text frames, keeps the close
// frame's code and reason, and answers the server's WebSocket pings when
// asked to.
type serverFrames struct {
	pongs, texts atomic.Int64
	mu           sync.Mutex // guards code, reason
	code         int
	reason       string
	ended        chan struct{}
}

func watch(rc *rawClient, answerPings bool) *serverFrames {
	sf := &serverFrames{ended: make(chan struct{})}
	go func() {
		defer close(sf.ended)
		for {
			_ = rc.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
			op, p, err := readServerFrame(rc.br)
			if err != nil {
				return
			}
			switch op {
			case 0x8:
				sf.mu.Lock()
				sf.code = 1005
				if len(p) >= 2 {
					sf.code, sf.reason = int(binary.BigEndian.Uint16(p)), string(p[2:])
				}
				sf.mu.Unlock()
				return
			case 0x9:
				if answerPings {
					_, _ = rc.nc.Write(clientFrame(opPong, p))
				}
			case 0xA:
				sf.pongs.Add(1)
			case 0x1:
				sf.texts.Add(1)
			}
		}
	}()
	return sf
}

// closed waits up to timeout for the server's close frame and returns its
// code and reason (0 when the connection is still open).
func (sf *serverFrames) closed(timeout time.Duration) (int, string) {
	select {
	case <-sf.ended:
	case <-time.After(timeout):
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return sf.code, sf.reason
}

// flood writes b in one go; the server may close before it has read it all.
func flood(rc *rawClient, b []byte) {
	_ = rc.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, _ = rc.nc.Write(b)
}

// Every WebSocket frame a client sends counts against the inbound frame
// rate (20 frames/s, burst 60), pings and pongs too: a client that floods
// pings gets no more pongs than the bucket holds and is closed with 1008
// like a client flooding data frames, and so is one sending pongs nobody
// asked for. Pings within the rate are answered, and share the bucket
// with the data frames.
func TestPingFloodIsClosedLikeAFrameFlood(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(1)[0]
	const burst = 60

	t.Run("ping flood", func(t *testing.T) {
		rc := in.rawConnect(u)
		sf := watch(rc, false)
		flood(rc, bytes.Repeat(clientFrame(opPing, nil), 20000))
		code, reason := sf.closed(20 * time.Second)
		if code != int(gateway.ClosePolicy) || reason != "frame rate" {
			t.Fatalf("20000 pings at once: close %d %q after %d pongs, want 1008 %q", code, reason, sf.pongs.Load(), "frame rate")
		}
		// The bucket refills by 20 a second while the flood is read: a
		// few more than the burst at most.
		if n := sf.pongs.Load(); n < burst || n > 2*burst {
			t.Fatalf("%d pongs for 20000 pings, want the burst (%d) and not many more", n, burst)
		}
	})
	t.Run("unsolicited pong flood", func(t *testing.T) {
		rc := in.rawConnect(u)
		sf := watch(rc, false)
		flood(rc, bytes.Repeat(clientFrame(opPong, nil), 20000))
		if code, reason := sf.closed(20 * time.Second); code != int(gateway.ClosePolicy) || reason != "frame rate" {
			t.Fatalf("20000 pongs at once: close %d %q, want 1008 %q", code, reason, "frame rate")
		}
	})
	testenv.Eventually(t, 20*time.Second, func() bool { return in.svc.Stats().Connections == 0 },
		"the flooding connections are still open")

	t.Run("pings and data frames share the bucket", func(t *testing.T) {
		// A bucket that does not refill during the test.
		in := newInstance(t, pool, opts{hub: func(c *gateway.Config) { c.FrameRate, c.FrameBurst = 0.01, 10 }})
		c := in.connect(u)
		for i := range 10 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.ws.Ping(ctx)
			cancel()
			if err != nil {
				t.Fatalf("ping %d of a burst of 10 not answered: %v", i+1, err)
			}
		}
		c.send(`{"type":"ping"}`)
		if code, reason := c.closeStatus(10 * time.Second); code != gateway.ClosePolicy || reason != "frame rate" {
			t.Fatalf("a data frame after 10 pings (burst 10): close %d %q, want 1008 %q", code, reason, "frame rate")
		}
	})
}

// A text frame may come in fragments. All of its WebSocket frames
// together may take twice the 4 KiB frame limit on the wire: a frame in a
// few fragments is answered, but a frame that goes on in empty fragments
// (which carry no payload for the 4 KiB limit to count) is closed with
// 1008 like a frame too big, and is never answered.
func TestEndlessEmptyFragmentsAreClosedLikeAFrameTooBig(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	u := in.users(1)[0]

	t.Run("a few fragments", func(t *testing.T) {
		rc := in.rawConnect(u)
		full := `{"type":"ping","pad":"`
		full += strings.Repeat("x", 4096-len(full)-2) + `"}`
		for _, n := range []int{2, 4, 64} {
			flood(rc, fragmented(full, n))
			if f := rc.readSkipPresence(); f.Type != "pong" {
				t.Fatalf("a 4 KiB frame in %d fragments answered %s, want pong", n, f.raw)
			}
		}
		flood(rc, fragmented(`{"type":"ping"}`, 15)) // one byte a fragment
		if f := rc.readSkipPresence(); f.Type != "pong" {
			t.Fatalf("a frame in 15 fragments answered %s, want pong", f.raw)
		}
	})
	t.Run("endless empty fragments", func(t *testing.T) {
		rc := in.rawConnect(u)
		sf := watch(rc, true)
		var b bytes.Buffer
		b.Write(clientFrame(opFirstOfText, nil))
		b.Write(bytes.Repeat(clientFrame(opContinuation, nil), 20000))
		b.Write(clientFrame(opLastFragment, []byte(`{"type":"ping"}`)))
		flood(rc, b.Bytes())
		if code, reason := sf.closed(20 * time.Second); code != int(gateway.ClosePolicy) || reason != "frame too big" {
			t.Fatalf("a frame of 20002 fragments (%d bytes): close %d %q, want 1008 %q", b.Len(), code, reason, "frame too big")
		}
		if n := sf.texts.Load(); n != 0 {
			t.Fatalf("a frame of 20002 fragments was answered (%d text frames)", n)
		}
	})
}

// A frame that has begun must be complete within FrameTimeout: a client
// that starts one and never finishes it, though it answers the server's
// pings and sends an empty fragment now and then, is closed with 1008 and
// holds nothing on the server after that. A connection that waits between
// frames, however long, stays open.
func TestUnfinishedFrameIsClosedAfterTheFrameTimeout(t *testing.T) {
	const frameTimeout = time.Second
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.FrameTimeout = frameTimeout
		c.PingInterval, c.PongTimeout = 200*time.Millisecond, 5*time.Second
	}})
	const n = 20
	users := in.users(n + 1)
	idle := in.rawConnect(users[n])
	idleFrames := watch(idle, true)
	unfinished := make([]*serverFrames, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		rc := in.rawConnect(users[i])
		unfinished[i] = watch(rc, true)
		flood(rc, clientFrame(opFirstOfText, []byte(`{"type":`)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-unfinished[i].ended:
					return
				case <-time.After(200 * time.Millisecond):
					_, _ = rc.nc.Write(clientFrame(opContinuation, nil))
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	start := time.Now()
	for i, sf := range unfinished {
		if code, reason := sf.closed(30 * time.Second); code != int(gateway.ClosePolicy) || reason != "frame too slow" {
			t.Fatalf("connection %d, its frame unfinished for %v (frame timeout %v): close %d %q, want 1008 %q",
				i, time.Since(start).Round(time.Millisecond), frameTimeout, code, reason, "frame too slow")
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return in.svc.Stats().Connections == 1 },
		"connections with an unfinished frame are still open")

	// The idle connection has waited far longer than the frame timeout.
	if time.Since(start) < 3*frameTimeout {
		time.Sleep(3*frameTimeout - time.Since(start))
	}
	if code, _ := idleFrames.closed(0); code != 0 {
		t.Fatalf("an idle connection was closed with %d", code)
	}
	idle.write(`{"type":"ping"}`)
	testenv.Eventually(t, 10*time.Second, func() bool { return idleFrames.texts.Load() > 0 },
		"the idle connection does not answer")
}

// A frame's time starts with its first byte, header included: a client
// that sends part of a frame header and no more (one byte of a text
// frame; a ping's first two bytes and half its mask key) is closed with
// 1008 after FrameTimeout like one that stops inside a payload, and holds
// nothing on the server after that.
func TestUnfinishedFrameHeaderIsClosedAfterTheFrameTimeout(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.FrameTimeout = time.Second }})
	parts := [][]byte{{0x81}, {opPing, 0x80 | 4, 1, 2}}
	users := in.users(len(parts))
	frames := make([]*serverFrames, len(parts))
	for i, part := range parts {
		rc := in.rawConnect(users[i])
		frames[i] = watch(rc, true)
		flood(rc, part)
	}
	for i, sf := range frames {
		if code, reason := sf.closed(20 * time.Second); code != int(gateway.ClosePolicy) || reason != "frame too slow" {
			t.Fatalf("header % x and nothing more: close %d %q, want 1008 %q", parts[i], code, reason, "frame too slow")
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return in.svc.Stats().Connections == 0 },
		"connections with an unfinished frame header are still open")
}
