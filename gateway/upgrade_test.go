package gateway_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
)

// writeCounter counts the writes on the connections a listener accepts.
type writeCounter struct {
	net.Listener
	mu    sync.Mutex
	conns []*countedConn
}

type countedConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (l *writeCounter) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &countedConn{Conn: nc}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// An accepted handshake reaches the client as one write: the 101 response
// and the hello frame together, with the handshake's headers.
func TestUpgradeResponseLeavesWithTheHello(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	lc := &writeCounter{}
	srv := httptest.NewUnstartedServer(in.svc.Handler())
	lc.Listener = srv.Listener
	srv.Listener = lc
	srv.Start()
	t.Cleanup(srv.Close)

	nc, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
		"Sec-WebSocket-Protocol: " + gateway.Subprotocol + "\r\nAuthorization: Bearer " + token(t, ids.New()) + "\r\n\r\n"
	if _, err := nc.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" ||
		resp.Header.Get("Sec-WebSocket-Protocol") != gateway.Subprotocol || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		t.Fatalf("upgrade response %d %v", resp.StatusCode, resp.Header)
	}
	// The first frame: an unmasked text frame carrying the hello.
	var head [4]byte
	if _, err := io.ReadFull(br, head[:2]); err != nil {
		t.Fatal(err)
	}
	n := int(head[1])
	if n == 126 {
		if _, err := io.ReadFull(br, head[2:4]); err != nil {
			t.Fatal(err)
		}
		n = int(binary.BigEndian.Uint16(head[2:4]))
	}
	if head[0] != 0x81 || n > 0xffff {
		t.Fatalf("first frame header % x, want an unmasked text frame", head)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(payload), `"type":"hello"`) {
		t.Fatalf("first frame %s, want the hello", payload)
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if len(lc.conns) != 1 || lc.conns[0].writes.Load() != 1 {
		t.Fatalf("%d connections; the upgrade and the hello took %d writes, want one", len(lc.conns), lc.conns[0].writes.Load())
	}
}
