package wsedge

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const upgradeHead = "GET /v1/realtime?ticket=abc HTTP/1.1\r\nHost: example.test\r\n" +
	"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
	"Sec-WebSocket-Version: 13\r\n\r\n"

// seen is what the test handler saw of one request.
type seen struct {
	edge     bool // served by the Listener, not net/http
	method   string
	uri      string
	host     string
	hostHdr  bool // a Host header left in req.Header
	remote   string
	cookie   int
	early    string // what the hijacked connection read first
	hijacked bool
	g        string // the goroutine that ran the handler
}

// server is an http.Server behind a Listener, on loopback, whose handler
// hijacks upgrade requests (reading what the client sent next, then
// answering "ok\n" on the raw connection) and answers others 426 with a
// JSON body, recording what it saw.
type server struct {
	addr  string
	ln    *Listener
	srv   *http.Server
	seen  chan seen
	serve chan error
}

func handler(out chan<- seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, edge := w.(*response)
		s := seen{edge: edge, method: r.Method, uri: r.RequestURI, host: r.Host, hostHdr: r.Header["Host"] != nil,
			remote: r.RemoteAddr, cookie: len(r.Header.Get("Cookie")), g: goroutine()}
		if r.Header.Get("X-Panic") != "" {
			panic("test panic")
		}
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUpgradeRequired)
			_, _ = io.WriteString(w, `{"error":"upgrade_required"}`)
			out <- s
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		s.hijacked = true
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b := make([]byte, 5)
		n, _ := io.ReadFull(brw, b)
		s.early = string(b[:n])
		_, _ = c.Write([]byte("ok\n"))
		_ = c.Close()
		out <- s
	})
}

func startServer(t *testing.T, headerTimeout time.Duration) *server {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: inner.Addr().String(), seen: make(chan seen, 16), serve: make(chan error, 1)}
	h := handler(s.seen)
	s.ln = New(inner, Config{Path: "/v1/realtime", Handler: h, HeaderTimeout: headerTimeout})
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout}
	go func() { s.serve <- s.srv.Serve(s.ln) }()
	t.Cleanup(func() {
		_ = s.srv.Close()
		if err := <-s.serve; err != http.ErrServerClosed {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func (s *server) next(t *testing.T) seen {
	t.Helper()
	select {
	case v := <-s.seen:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("the handler was not called")
		return seen{}
	}
}

func (s *server) none(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case v := <-s.seen:
		t.Fatalf("the handler was called: %+v", v)
	case <-time.After(within):
	}
}

// An upgrade request is served by the Listener: the handler gets the
// request as net/http would give it, and the bytes the client sent right
// after the header (its first frame) come first off the hijacked
// connection.
func TestAnUpgradeIsServedHereWithItsEarlyBytes(t *testing.T) {
	s := startServer(t, 5*time.Second)
	c := dial(t, s.addr)
	got := s.upgrade(t, c)
	if got.method != "GET" || got.uri != "/v1/realtime?ticket=abc" || got.host != "example.test" || got.hostHdr {
		t.Fatalf("request as seen: %+v", got)
	}
	if got.remote != c.LocalAddr().String() {
		t.Fatalf("RemoteAddr %q, want the client's %q", got.remote, c.LocalAddr())
	}
	if got.early != "frame" {
		t.Fatalf("first bytes after the header: %q, want %q", got.early, "frame")
	}
}

// upgrade sends the upgrade request and a first frame on c and returns
// what the handler saw, once it has hijacked the connection and answered.
func (s *server) upgrade(t *testing.T, c net.Conn) seen {
	t.Helper()
	if _, err := io.WriteString(c, upgradeHead+"frame"); err != nil {
		t.Fatal(err)
	}
	got := s.next(t)
	if !got.edge || !got.hijacked {
		t.Fatalf("served by net/http or not hijacked: %+v", got)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ok\n" {
		t.Fatalf("reply %q, %v", line, err)
	}
	return got
}

// Upgrades served one after another run on one goroutine, which keeps the
// stack the handler grew, instead of a fresh goroutine per connection
// whose stack grows anew in every handshake.
func TestUpgradesReuseTheirHandlersGoroutine(t *testing.T) {
	s := startServer(t, 5*time.Second)
	gs := map[string]bool{}
	for range 20 {
		gs[s.upgrade(t, dial(t, s.addr)).g] = true
	}
	if len(gs) > 2 {
		t.Fatalf("20 upgrades one after another ran on %d goroutines, want them on a reused one", len(gs))
	}
}

// goroutine is the calling goroutine's id, from its stack trace's header.
func goroutine() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// A header that arrives a byte at a time is still served, once whole.
func TestATrickledUpgradeIsServedOnceWhole(t *testing.T) {
	s := startServer(t, 5*time.Second)
	c := dial(t, s.addr)
	for i := 0; i < len(upgradeHead); i++ {
		if _, err := c.Write([]byte{upgradeHead[i]}); err != nil {
			t.Fatal(err)
		}
		if i%40 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	_, _ = io.WriteString(c, "xy123")
	if got := s.next(t); !got.edge || got.early != "xy123" {
		t.Fatalf("trickled upgrade: %+v", got)
	}
}

// Every request that is not a plain upgrade of the path goes to net/http
// with nothing read: the answer is the one a server without the Listener
// gives, byte for byte in its status line.
func TestOtherRequestsReachNetHTTPUntouched(t *testing.T) {
	bigCookie := "Cookie: s=" + strings.Repeat("c", 6000) + "\r\n"
	cases := []struct {
		name, req string
		status    string // the status line net/http answers with
		handler   bool   // the handler is called (by net/http)
	}{
		{"another path", "GET /v1/dialogs HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 426 Upgrade Required", true},
		{"a longer path", "GET /v1/realtimeX HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "", true},
		{"POST", "POST /v1/realtime HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 426 Upgrade Required", true},
		{"no Upgrade header", "GET /v1/realtime HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 426 Upgrade Required", true},
		{"a header over the buffer", "GET /v1/realtime HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" + bigCookie + "\r\n", "", true},
		{"HTTP/1.0", "GET /v1/realtime HTTP/1.0\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "", true},
		{"bare LF lines", "GET /v1/realtime HTTP/1.1\nHost: h\nUpgrade: websocket\nConnection: Upgrade\n\n", "", true},
		{"two Host headers", "GET /v1/realtime HTTP/1.1\r\nHost: a\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "HTTP/1.1 400 Bad Request", false},
		{"no Host", "GET /v1/realtime HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "HTTP/1.1 400 Bad Request", false},
		{"a NUL in a value", "GET /v1/realtime HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "HTTP/1.1 400 Bad Request", false},
		{"a body", "GET /v1/realtime HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nab", "", true},
		{"malformed request line", "GET /v1/realtime\r\nHost: h\r\n\r\n", "HTTP/1.1 400 Bad Request", false},
		{"an encoded path", "GET /v1/real%74ime HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "", true},
	}
	s := startServer(t, 5*time.Second)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s.addr)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			if tc.handler {
				if got := s.next(t); got.edge {
					t.Fatalf("served by the Listener: %+v", got)
				} else if strings.Contains(tc.name, "over the buffer") && got.cookie != 6002 {
					t.Fatalf("the Cookie reached the handler with %d bytes, want 6002", got.cookie)
				}
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			line = strings.TrimRight(line, "\r\n")
			if tc.status != "" && !strings.HasPrefix(line, tc.status) {
				t.Fatalf("status line %q, want %q", line, tc.status)
			}
			if !strings.HasPrefix(line, "HTTP/1.1 ") && !strings.HasPrefix(line, "HTTP/1.0 ") && line != "ok" {
				t.Fatalf("no answer: %q", line)
			}
			if !tc.handler {
				s.none(t, 50*time.Millisecond)
			}
		})
	}
}

// A handler that answers instead of hijacking is answered with its
// status, header and body, Connection: close, and the connection closes.
func TestAnAnswerWithoutAHijackClosesTheConnection(t *testing.T) {
	s := startServer(t, 5*time.Second)
	c := dial(t, s.addr)
	// An upgrade request that the handler refuses: no Upgrade token it
	// knows, so it answers 426 (the Listener still takes it: the header
	// says websocket in another case).
	req := strings.Replace(upgradeHead, "Upgrade: websocket", "Upgrade: WebSocket, x", 1)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if got := s.next(t); !got.edge || got.hijacked {
		t.Fatalf("want served here without a hijack: %+v", got)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUpgradeRequired || string(body) != `{"error":"upgrade_required"}` ||
		resp.Header.Get("Content-Type") != "application/json" || !resp.Close || resp.Header.Get("Date") == "" {
		t.Fatalf("answer %d %q %v close=%v", resp.StatusCode, body, resp.Header, resp.Close)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the answer: %d bytes, %v; want EOF", n, err)
	}
}

// A client that sends nothing, or part of an upgrade header and then
// nothing, is closed when the header timeout passes, without the handler.
func TestSilentAndStalledClientsAreClosedAtTheHeaderTimeout(t *testing.T) {
	s := startServer(t, 300*time.Millisecond)
	for _, first := range []string{"", "GET /v1/realtime HTTP/1.1\r\nHost: h\r\n"} {
		c := dial(t, s.addr)
		if first != "" {
			if _, err := io.WriteString(c, first); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		n, err := c.Read(make([]byte, 64))
		if took := time.Since(start); n != 0 || err == nil || took > 3*time.Second {
			t.Fatalf("sent %q: read %d bytes, %v after %v; want the connection closed at the timeout", first, n, err, took)
		}
	}
	s.none(t, 50*time.Millisecond)
}

// A panicking handler costs its connection only.
func TestAPanicClosesOnlyItsConnection(t *testing.T) {
	s := startServer(t, 5*time.Second)
	c := dial(t, s.addr)
	if _, err := io.WriteString(c, strings.Replace(upgradeHead, "\r\n\r\n", "\r\nX-Panic: 1\r\n\r\n", 1)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("after the panic: %d bytes, %v", n, err)
	}
	c2 := dial(t, s.addr)
	if _, err := io.WriteString(c2, upgradeHead+"again"); err != nil {
		t.Fatal(err)
	}
	if got := s.next(t); got.early != "again" {
		t.Fatalf("the next upgrade: %+v", got)
	}
}

// Closing the server closes connections still sending their first
// request and returns at once; nothing is left running.
func TestCloseEndsConnectionsBeingLookedAt(t *testing.T) {
	s := startServer(t, time.Minute)
	var conns []net.Conn
	for range 20 {
		c := dial(t, s.addr)
		_, _ = io.WriteString(c, "GET /v1/realtime HTTP/1.1\r\n")
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond) // accepted and being looked at
	start := time.Now()
	if err := s.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v", took)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
				t.Errorf("connection still open after Close: %d, %v", n, err)
			}
		})
	}
	wg.Wait()
}

// looking is how many connections l is looking at.
func looking(l *Listener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sniffing)
}

// A client that sends the start of an upgrade request and then ends its
// side (a FIN, or a reset) is not held until the header timeout: a peek
// shows the queued bytes again, never the end, so the connection goes to
// net/http, which reads them and the end and closes it at once.
func TestAClientThatEndsItsSideMidRequestIsNotHeld(t *testing.T) {
	s := startServer(t, 30*time.Second)
	// A reset client cannot read its socket any more: the Listener's own
	// count of connections it looks at tells.
	for _, end := range []string{"fin", "reset"} {
		c := dial(t, s.addr)
		if _, err := io.WriteString(c, "GET /v1/realtime HTTP/1.1\r\nHost: h\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // looked at, still pending
		tc := c.(*net.TCPConn)
		start := time.Now()
		if end == "fin" {
			if err := tc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Fatalf("after the client's FIN: %v after %v, want the connection closed at once (header timeout 30 s)", err, time.Since(start))
			}
		} else {
			_ = tc.SetLinger(0)
			_ = c.Close()
		}
		deadline := time.Now().Add(5 * time.Second)
		for looking(s.ln) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the connection is still being looked at after %v (header timeout 30 s)", end, time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	s.none(t, 50*time.Millisecond)
}
