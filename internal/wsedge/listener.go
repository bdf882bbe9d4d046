package wsedge

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/han-app/gateway/internal/workers"
)

// peekBytes bounds the request header a Listener serves itself: a longer
// one (large cookies, say) goes to net/http.
const peekBytes = 4096

// Config says which requests a Listener serves and with what.
type Config struct {
	// Path is the one path served here, e.g. "/v1/realtime" (no query).
	Path string
	// Handler serves the requests taken here: the server's whole handler,
	// so they pass the same middleware as through net/http.
	Handler http.Handler
	// HeaderTimeout bounds the time from accept to the end of the request
	// header; a connection that has not sent it by then is closed. Give
	// net/http's ReadHeaderTimeout (0: no bound).
	HeaderTimeout time.Duration
	// Logger reports a handler's panic (nil: slog.Default()).
	Logger *slog.Logger
}

// Listener wraps a net.Listener for an http.Server: Accept returns the
// connections the Listener did not serve itself, with nothing read from
// them. It is safe for concurrent use.
type Listener struct {
	inner   net.Listener
	cfg     Config
	prefix  []byte // "GET " + Path
	handoff chan net.Conn
	done    chan struct{}

	mu       sync.Mutex
	err      error                 // why accepting stopped, set before done closes
	sniffing map[net.Conn]struct{} // connections whose first request is being looked at
	closing  sync.Once
	wg       sync.WaitGroup // the accept loop and the connections being looked at

	// runners serve new connections (serve) on goroutines that wait for
	// the next one instead of exiting. A handshake runs deep (the
	// middleware, the upgrade, the token's verification, the presence
	// registration): on a fresh goroutine per connection its stack grew
	// from the minimum in two or three copies, an eighth of the CPU of a
	// connect storm. A runner keeps its grown stack; one idle for
	// runnerIdle exits, and beyond runnersMax a connection gets a
	// goroutine of its own as before.
	runners *workers.Pool[net.Conn]
}

const (
	runnersMax = 128
	runnerIdle = 2 * time.Second
)

// New starts accepting on inner.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &Listener{
		inner:    inner,
		cfg:      cfg,
		prefix:   []byte("GET " + cfg.Path),
		handoff:  make(chan net.Conn),
		done:     make(chan struct{}),
		sniffing: make(map[net.Conn]struct{}),
	}
	l.runners = workers.New(runnersMax, runnerIdle, l.serve)
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection for net/http.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.handoff:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Close stops accepting, closes the connections whose first request is
// still being looked at, and waits for them; requests already in their
// handler run on (a hijacked connection is its handler's). Idempotent.
func (l *Listener) Close() error {
	var err error
	l.closing.Do(func() { err = l.inner.Close() })
	l.stop(net.ErrClosed)
	l.wg.Wait()
	l.runners.Stop() // requests in their handler run on
	return err
}

func (l *Listener) stop(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	close(l.done)
	for c := range l.sniffing {
		_ = c.Close()
	}
	clear(l.sniffing)
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.inner.Accept()
		if err != nil {
			// Out of descriptors and the like: wait and try again, as
			// net/http does.
			if t, ok := err.(interface{ Temporary() bool }); ok && t.Temporary() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
					continue
				case <-l.done:
					return
				}
			}
			l.stop(err)
			return
		}
		delay = 0
		l.mu.Lock()
		if l.err != nil {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.sniffing[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		if !l.runners.TryRun(c) {
			go l.serve(c)
		}
	}
}

// untrack ends the look at c's first request; false when Close has
// closed c meanwhile.
func (l *Listener) untrack(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.sniffing[c]
	delete(l.sniffing, c)
	return ok
}

var peekBufs = sync.Pool{New: func() any { b := make([]byte, peekBytes); return &b }}

// serve looks at c's first request and serves it, hands c to net/http, or
// closes it.
func (l *Listener) serve(c net.Conn) {
	if req, v := l.look(c); v == taken {
		l.run(c, req)
	}
}

// look is the part of serve that Close waits for: it decides on c's first
// request, and hands c to net/http or closes it unless the request is
// taken.
func (l *Listener) look(c net.Conn) (*http.Request, verdict) {
	defer l.wg.Done()
	buf := peekBufs.Get().(*[]byte)
	req, v := l.take(c, *buf)
	peekBufs.Put(buf)
	if !l.untrack(c) {
		v = dropped // closed by Close meanwhile
	}
	switch v {
	case taken:
		return req, v
	case handOff:
		// net/http sets its own deadlines; clear the look's.
		_ = c.SetReadDeadline(time.Time{})
		select {
		case l.handoff <- c:
		case <-l.done:
			_ = c.Close()
		}
	default:
		_ = c.Close()
	}
	return nil, v
}

// verdict is what to do with a connection's first request.
type verdict int

const (
	pending verdict = iota // not all of it has arrived
	handOff                // net/http's
	taken                  // read off the socket; serve it here
	dropped                // nothing sent in time, the client went away, or a socket error: close
)

var (
	crlfEnd = []byte("\n\r\n")
	lfEnd   = []byte("\n\n")
)

// judge looks at the first bytes of a connection: the request is ours only
// when it is a GET of the path whose whole header, in CRLF lines, is in
// b. It returns the header's length when taken.
func (l *Listener) judge(b []byte, full bool) (int, verdict) {
	if k := min(len(b), len(l.prefix)); !bytes.Equal(b[:k], l.prefix[:k]) {
		return 0, handOff
	}
	if len(b) <= len(l.prefix) {
		return 0, pending
	}
	if c := b[len(l.prefix)]; c != ' ' && c != '?' {
		return 0, handOff
	}
	end := bytes.Index(b, crlfEnd)
	// A bare LF ends lines too for net/http; leave those requests to it.
	if lf := bytes.Index(b, lfEnd); lf >= 0 && (end < 0 || lf < end) {
		return 0, handOff
	}
	switch {
	case end < 0 && full:
		return 0, handOff
	case end < 0:
		return 0, pending
	case b[end-1] != '\r':
		return 0, handOff
	}
	return end + len(crlfEnd), taken
}

// peek waits, within the header timeout, until judge decides on what c
// sent, without taking it off the socket.
func (l *Listener) peek(c net.Conn, buf []byte) (int, verdict) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, handOff
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, handOff
	}
	if l.cfg.HeaderTimeout > 0 {
		if err := c.SetReadDeadline(time.Now().Add(l.cfg.HeaderTimeout)); err != nil {
			return 0, dropped
		}
	}
	n, v, seen := 0, pending, -1
	err = raw.Read(func(fd uintptr) bool {
		for {
			m, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // wait for more bytes
			case err != nil || m == 0:
				v = dropped
				return true
			case m == seen:
				// Woken with no new bytes. Mostly the readiness of bytes
				// already judged: wait on. Or the client ended its side:
				// a FIN or a reset leaves the bytes queued, and a peek
				// shows them again, never the end, so waiting would hold
				// the connection until the header timeout; net/http
				// reads the bytes and then the end.
				if peerEnded(fd) {
					v = handOff
					return true
				}
				return false
			}
			seen = m
			n, v = l.judge(buf[:m], m == len(buf))
			return v != pending
		}
	})
	if err != nil {
		return 0, dropped // the header timeout, or closed
	}
	return n, v
}

// peerEnded reports whether the peer of the socket fd has ended its side
// (shut down its writing, or reset): poll(2) without waiting, for
// POLLRDHUP and the hang-up and error events.
func peerEnded(fd uintptr) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}

var headReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, peekBytes) }}

// take decides on c's first request; when it is taken, the request has
// been read off the socket and parsed.
func (l *Listener) take(c net.Conn, buf []byte) (*http.Request, verdict) {
	n, v := l.peek(c, buf)
	if v != taken {
		return nil, v
	}
	br := headReaders.Get().(*bufio.Reader)
	br.Reset(bytes.NewReader(buf[:n]))
	req, err := http.ReadRequest(br)
	br.Reset(nil)
	headReaders.Put(br)
	if err != nil || !upgradeRequest(req, buf[:n], l.cfg.Path) {
		return nil, handOff
	}
	// The header is in the socket's buffer: this read takes exactly it,
	// and what the client sent after it stays for the WebSocket reader.
	if _, err := io.ReadFull(c, buf[:n]); err != nil {
		return nil, dropped
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return nil, dropped
	}
	req.RemoteAddr = c.RemoteAddr().String()
	return req, taken
}

// run serves a taken request: the handler hijacks the connection, or its
// answer is written with Connection: close and the connection closed.
func (l *Listener) run(c net.Conn, req *http.Request) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req = req.WithContext(ctx)
	w := &response{conn: c, header: make(http.Header)}
	if !l.serveHTTP(w, req) {
		_ = c.Close()
		return
	}
	if w.hijacked {
		return
	}
	w.finish()
}

// serveHTTP runs the handler; false when it panicked.
func (l *Listener) serveHTTP(w *response, req *http.Request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			if p != http.ErrAbortHandler {
				l.cfg.Logger.Error("wsedge: handler panicked", slog.String("path", l.cfg.Path), slog.Any("panic", p))
			}
		}
	}()
	l.cfg.Handler.ServeHTTP(w, req)
	return true
}
