package gateway_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// hugeFrameHeader is a masked binary frame header declaring 2^62 bytes of
// payload: a client that sends it and then nothing, or then keeps sending,
// while the server waits for its close frame.
var hugeFrameHeader = []byte{0x82, 0x80 | 127, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}

// A refused handshake (here a bad token) ends in a close frame whose
// answer the server waits for; a client that follows its upgrade request
// with the header of an endless frame and then sends nothing is closed
// after CloseTimeout, instead of holding the socket and the handshake's
// goroutine for good.
func TestRefusedHandshakeDoesNotWaitForeverForTheCloseReply(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.CloseTimeout = 500 * time.Millisecond }})
	addr := strings.TrimPrefix(in.srv.URL, "http://")
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	req := fmt.Sprintf("GET /v1/realtime HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\nAuthorization: Bearer not-a-token\r\n\r\n",
		addr, base64.StdEncoding.EncodeToString(key), gateway.Subprotocol)
	if _, err := nc.Write(append([]byte(req), hugeFrameHeader...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	op, p, err := readServerFrame(br)
	if err != nil || op != 0x8 || len(p) < 2 || binary.BigEndian.Uint16(p) != uint16(gateway.CloseUnauthorized) {
		t.Fatalf("want a close 4001 frame, got op %x % x %v", op, p, err)
	}
	if !testenv.PeerCloses(nc, br, 10*time.Second) {
		t.Fatal("the refused socket is still open 10 s after its close frame: the server waits for a close reply without bound")
	}
}

// After the server's close frame (here for a binary frame),
// the handshake's reads are bounded in time and in bytes: a client that
// declared an endless frame and went quiet is closed after CloseTimeout,
// and one that keeps sending is closed once it has sent more than a frame
// may take on the wire, long before CloseTimeout; both connections leave
// the hub.
func TestCloseHandshakeReadsAreBounded(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.CloseTimeout = 500 * time.Millisecond }})
	long := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.CloseTimeout = time.Minute }})

	t.Run("quiet after the header", func(t *testing.T) {
		rc := in.rawConnect(in.users(1)[0])
		flood(rc, hugeFrameHeader)
		sf := watch(rc, false)
		if code, reason := sf.closed(10 * time.Second); code != int(gateway.CloseUnsupported) {
			t.Fatalf("close %d %q, want 1003 (a binary frame)", code, reason)
		}
		if !testenv.PeerCloses(rc.nc, rc.br, 10*time.Second) {
			t.Fatal("socket still open 10 s after the close frame")
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().Connections == 0 }, "the connection is still in the hub")
	})
	t.Run("sending without end", func(t *testing.T) {
		rc := long.rawConnect(long.users(1)[0])
		sf := watch(rc, false)
		stopped := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			chunk := make([]byte, 16<<10)
			_ = rc.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := rc.nc.Write(hugeFrameHeader); err == nil {
				for {
					if _, err := rc.nc.Write(chunk); err != nil {
						break
					}
				}
			}
			stopped <- time.Since(start)
		}()
		if code, reason := sf.closed(10 * time.Second); code != int(gateway.CloseUnsupported) {
			t.Fatalf("close %d %q, want 1003 (a binary frame)", code, reason)
		}
		select {
		case d := <-stopped:
			if d >= 20*time.Second {
				t.Fatalf("the server read the endless frame for %v", d)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the server still reads an endless frame 20 s after closing (CloseTimeout is a minute: the byte bound should have ended it)")
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return long.svc.Stats().Connections == 0 }, "the connection is still in the hub")
	})
}

// A close decided elsewhere (here a drain) while a client frame is half
// read waits for that frame: the ping is answered, then the close frame
// goes out and the handshake ends cleanly. Cut off in its middle, the
// ping's remaining bytes were read by the handshake as frames.
func TestACloseWaitsForTheFrameBeingRead(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	rc := in.rawConnect(in.users(1)[0])
	ping := clientFrame(opPing, []byte("abcd"))
	flood(rc, ping[:3])
	time.Sleep(200 * time.Millisecond) // a frame worker now waits in the ping's read
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		drained <- in.svc.Drain(ctx)
	}()
	time.Sleep(300 * time.Millisecond) // the drain has asked for the close
	flood(rc, ping[3:])
	_ = rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for {
		op, p, err := readServerFrame(rc.br)
		if err != nil {
			t.Fatalf("frames %v, then %v", got, err)
		}
		if op == 0x1 {
			continue // an event
		}
		got = append(got, fmt.Sprintf("%x:%q", op, p))
		if op == 0x8 {
			if len(p) < 2 || binary.BigEndian.Uint16(p) != uint16(gateway.CloseGoingAway) {
				t.Fatalf("close frame % x, want 1001", p)
			}
			break
		}
	}
	if len(got) != 2 || got[0] != fmt.Sprintf("a:%q", "abcd") {
		t.Fatalf("frames %v, want the pong of the ping being read, then the close", got)
	}
	flood(rc, clientFrame(0x88, []byte{0x03, 0xe9}))
	if !testenv.PeerCloses(rc.nc, rc.br, 10*time.Second) {
		t.Fatal("socket still open 10 s after the close reply")
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
}
