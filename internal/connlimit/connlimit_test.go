package connlimit_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/connlimit"
	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// serve accepts through a capped listener and holds every accepted
// connection open until the client closes it.
func serve(t *testing.T, cfg connlimit.Config) (*connlimit.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(ln, cfg)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l, ln.Addr().String()
}

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refused reads the canned answer the listener writes over a cap.
func refused(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || string(b) != `{"error":"overloaded"}` || resp.Header.Get("Retry-After") != "1" || !resp.Close {
		t.Fatalf("refusal: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	return true
}

func TestPerPeerCapRefusesWithCanned503AndOtherPeersStillConnect(t *testing.T) {
	var reasons []string
	var mu sync.Mutex
	l, addr := serve(t, connlimit.Config{Max: 10, PerIP: 3, OnRefuse: func(r string) { mu.Lock(); reasons = append(reasons, r); mu.Unlock() }})
	var held []net.Conn
	for i := 0; i < 3; i++ {
		held = append(held, dialFrom(t, "127.0.0.1", addr))
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return l.Open() == 3 }, "3 connections counted")
	// The refused client even sends a request first: the answer must still
	// arrive intact (no reset from unread input).
	over := dialFrom(t, "127.0.0.1", addr)
	_, _ = io.WriteString(over, "POST /v1/dialogs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc")
	if !refused(t, over) {
		t.Fatal("the 4th connection of one peer was not refused with the canned 503")
	}
	if !refused(t, dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("the 5th connection of one peer was not refused")
	}
	other := dialFrom(t, "127.0.0.2", addr)
	if refused(t, other) {
		t.Fatal("another peer was refused")
	}
	// Closing a held connection frees its place.
	_ = held[0].Close()
	testenv.Eventually(t, 5*time.Second, func() bool { return l.Open() == 3 }, "a closed connection is released")
	if refused(t, dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("a freed place was not reused")
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(reasons, ",") != "per_ip,per_ip" {
		t.Fatalf("refusal reasons: %v", reasons)
	}
}

func TestTotalCapAndUnlimitedPeers(t *testing.T) {
	unlimited := []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")}
	l, addr := serve(t, connlimit.Config{Max: 4, PerIP: 1, Unlimited: unlimited})
	// A trusted proxy is not held to the per-peer cap...
	for i := 0; i < 3; i++ {
		if refused(t, dialFrom(t, "127.0.0.3", addr)) {
			t.Fatalf("trusted proxy connection %d refused", i)
		}
	}
	if refused(t, dialFrom(t, "127.0.0.4", addr)) {
		t.Fatal("first connection of a peer refused")
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return l.Open() == 4 }, "4 connections counted")
	// ...but counts towards the process cap.
	if !refused(t, dialFrom(t, "127.0.0.3", addr)) {
		t.Fatal("the process cap does not apply to a trusted proxy")
	}
	if !refused(t, dialFrom(t, "127.0.0.5", addr)) {
		t.Fatal("a new peer over the process cap was not refused")
	}
}

// An accepted connection still reaches its socket's descriptor through the
// wrapper (syscall.Conn), and writes through it arrive: the WebSocket
// writer's non-blocking writes depend on it.
func TestAcceptedConnKeepsItsSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(ln, connlimit.Config{Max: 4, PerIP: 4})
	defer l.Close()
	client := dialFrom(t, "127.0.0.1", ln.Addr().String())
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatalf("%T does not expose its socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	if err := raw.Write(func(fd uintptr) bool {
		_, werr = syscall.Write(int(fd), []byte("hi"))
		return true
	}); err != nil || werr != nil {
		t.Fatal(err, werr)
	}
	b := make([]byte, 2)
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(client, b); err != nil || string(b) != "hi" {
		t.Fatalf("read %q: %v", b, err)
	}
}

// A connection over the cap that Accept takes while Close runs is closed,
// not refused in the background: Close waits for the refusals in flight, and
// none starts after it returned to hold a descriptor and write to a client
// of a listener that is gone.
func TestNoRefusalOutlivesClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing, closed := make(chan struct{}), make(chan struct{})
	l := connlimit.New(ln, connlimit.Config{Max: 1, PerIP: 1, OnRefuse: func(string) {
		close(refusing)
		<-closed // Close runs between the accept and the refusal
	}})
	accepted := make(chan net.Conn, 1)
	acceptDone := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			acceptDone <- err
			return
		}
		accepted <- c
		_, err = l.Accept()
		acceptDone <- err
	}()
	dialFrom(t, "127.0.0.1", ln.Addr().String()) // takes the one place
	c := <-accepted
	defer c.Close()
	over := dialFrom(t, "127.0.0.1", ln.Addr().String())
	<-refusing
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	close(closed)
	if err := <-acceptDone; err == nil {
		t.Fatal("Accept after Close returned a connection")
	}
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(over); len(b) != 0 || isTimeout(err) {
		t.Fatalf("the connection accepted as Close ran: read %q (%v), want it closed unanswered", b, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
