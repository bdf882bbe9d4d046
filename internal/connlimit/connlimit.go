package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config sets the caps. Max and PerIP must be positive.
type Config struct {
	Max   int // open connections of the process
	PerIP int // open connections of one TCP peer address
	// Unlimited peers (trusted proxies) are exempt from PerIP: one proxy
	// carries many clients. They still count towards Max.
	Unlimited []netip.Prefix
	// RetryAfter is the Retry-After of the refusal; zero value means 1s.
	RetryAfter time.Duration
	// OnRefuse, when set, is called once per refused connection with the
	// cap that was hit ("total" or "per_ip").
	OnRefuse func(reason string)
}

// The refusal is written within refuseWriteTimeout, so a client that
// never reads cannot hold the descriptor. What the client already sent is
// then discarded (never parsed) for at most lingerTimeout after a FIN:
// closing a socket with unread input makes the kernel send RST, which can
// destroy the answer before the client reads it. At most MaxLingering
// refused connections linger at once; beyond that they close at once.
const (
	refuseWriteTimeout = time.Second
	lingerTimeout      = time.Second
	lingerMaxBytes     = 64 << 10
)

// MaxLingering bounds the refused connections that hold their descriptor
// past the answer (each for at most a second): the descriptors a process
// keeps free beside its cap must cover them.
const MaxLingering = 64

// Listener is a net.Listener that enforces Config.
type Listener struct {
	net.Listener
	cfg    Config
	refuse []byte

	mu     sync.Mutex
	total  int
	perIP  map[netip.Addr]int
	linger atomic.Int32
	closed bool           // guarded by mu: Close was called
	wg     sync.WaitGroup // refusals in flight, added to under mu
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	secs := int((cfg.RetryAfter + time.Second - 1) / time.Second)
	body := `{"error":"overloaded"}`
	resp := "HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		"Retry-After: " + strconv.Itoa(secs) + "\r\n" +
		"Connection: close\r\n\r\n" + body
	return &Listener{Listener: ln, cfg: cfg, refuse: []byte(resp), perIP: map[netip.Addr]int{}}
}

// Open reports the connections currently counted.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Accept returns the next connection within the caps; connections over a
// cap are refused in the background and never returned.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerAddr(c)
		if reason := l.acquire(peer); reason != "" {
			if l.cfg.OnRefuse != nil {
				l.cfg.OnRefuse(reason)
			}
			if l.refusing() {
				go l.refuseConn(c)
			} else {
				_ = c.Close() // accepted as Close ran: no refusal outlives it
			}
			continue
		}
		return &conn{Conn: c, l: l, peer: peer}, nil
	}
}

// Close stops accepting and waits for refusals in flight (each bounded by
// the write and linger timeouts); a connection over a cap accepted as Close
// runs is closed unanswered.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

// refusing counts a refusal in flight, unless Close was called: an add to
// the wait group must happen before Close waits on it.
func (l *Listener) refusing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	return true
}

func (l *Listener) acquire(peer netip.Addr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.cfg.Max {
		return "total"
	}
	limited := peer.IsValid() && !l.unlimited(peer)
	key := peerKey(peer)
	if limited && l.perIP[key] >= l.cfg.PerIP {
		return "per_ip"
	}
	l.total++
	if limited {
		l.perIP[key]++
	}
	return ""
}

// peerKey is what the per-address cap counts: an IPv4 peer's address, an
// IPv6 peer's /64 (a network gives each host at least that much, and a
// host may open each connection from another address inside it).
func peerKey(a netip.Addr) netip.Addr {
	if a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().Addr()
	}
	return a
}

// release gives back what acquire took. A peer acquire did not count (a
// trusted proxy, no address) uncounts nothing: its key may be another
// peer's (an IPv6 /64 shared with an untrusted host).
func (l *Listener) release(peer netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if !peer.IsValid() || l.unlimited(peer) {
		return
	}
	peer = peerKey(peer)
	if n, ok := l.perIP[peer]; ok {
		if n <= 1 {
			delete(l.perIP, peer)
		} else {
			l.perIP[peer] = n - 1
		}
	}
}

func (l *Listener) unlimited(a netip.Addr) bool {
	for _, p := range l.cfg.Unlimited {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (l *Listener) refuseConn(c net.Conn) {
	defer l.wg.Done()
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
	if _, err := c.Write(l.refuse); err != nil {
		return
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok || l.linger.Add(1) > MaxLingering {
		l.linger.Add(-1)
		return
	}
	defer l.linger.Add(-1)
	if cw.CloseWrite() != nil {
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, lingerMaxBytes))
}

func peerAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// conn releases its place once, on the first Close.
type conn struct {
	net.Conn
	l      *Listener
	peer   netip.Addr
	closed atomic.Bool
}

func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.peer)
	}
	return c.Conn.Close()
}

// CloseWrite keeps net/http's graceful half-close working through the
// wrapper.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// SyscallConn keeps the socket's descriptor reachable through the wrapper
// (the WebSocket writer's non-blocking writes use it).
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// ReadFrom keeps the kernel's sendfile/splice path of net/http responses
// (it looks for io.ReaderFrom on the connection).
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// SetWriteBuffer keeps SO_SNDBUF settable through the wrapper (the gateway
// sizes the send buffer of hijacked WebSocket connections).
func (c *conn) SetWriteBuffer(n int) error {
	if sb, ok := c.Conn.(interface{ SetWriteBuffer(int) error }); ok {
		return sb.SetWriteBuffer(n)
	}
	return nil
}
