package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotLoopback is returned for any target outside the loopback network:
// the load generator refuses to point load at another machine.
var ErrNotLoopback = errors.New("loadtest: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed")

// CheckLoopbackHost accepts a host (no port) that is a loopback IP literal
// or "localhost". Names are not resolved: a name that happens to resolve to
// loopback today could point elsewhere tomorrow.
func CheckLoopbackHost(host string) error {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("%w: %q is not one", ErrNotLoopback, host)
	}
	return nil
}

// CheckLoopbackURL parses raw (http, https, ws, wss or redis URL) and
// refuses it unless its host is loopback. A Redis Cluster URL also names
// seed nodes in addr= parameters, which the client dials as well: each
// must be loopback too.
func CheckLoopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("loadtest: bad URL %q", redactURL(raw))
	}
	if err := CheckLoopbackHost(u.Hostname()); err != nil {
		return nil, err
	}
	for _, addr := range u.Query()["addr"] {
		host := addr
		if h, _, err := net.SplitHostPort(addr); err == nil {
			host = h
		}
		if err := CheckLoopbackHost(host); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// redactURL drops userinfo so passwords never reach an error message.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		u.User = url.User("***")
		return u.String()
	}
	if i := strings.LastIndexByte(raw, '@'); i >= 0 {
		return "***" + raw[i:]
	}
	return raw
}

// DefaultSourceRange is the pool of loopback source addresses clients bind
// to: one destination address and port allow only as many connections as
// there are ephemeral ports (≈28k on Linux) per source address, so spreading
// clients over 253 source addresses removes that ceiling. Linux routes all
// of 127.0.0.0/8 to the loopback interface without configuration.
const DefaultSourceRange = "127.0.0.2-127.0.0.254"

// SourceAddrs hands out loopback source addresses round-robin. The zero
// value (or nil) binds nothing. Safe for concurrent use.
type SourceAddrs struct {
	ips  []net.IP
	next atomic.Uint64
}

// ParseSourceRange parses "A-B" (inclusive IPv4 range inside 127.0.0.0/8),
// a single address, or "" / "none" for no binding.
func ParseSourceRange(s string) (*SourceAddrs, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return &SourceAddrs{}, nil
	}
	from, to, found := strings.Cut(s, "-")
	a, err := netip.ParseAddr(strings.TrimSpace(from))
	b := a
	if err == nil && found {
		b, err = netip.ParseAddr(strings.TrimSpace(to))
	}
	if err != nil || !a.Is4() || !b.Is4() || !a.IsLoopback() || !b.IsLoopback() || b.Less(a) {
		return nil, fmt.Errorf("loadtest: source range %q: want A-B inside 127.0.0.0/8 (e.g. %s)", s, DefaultSourceRange)
	}
	var ips []net.IP
	for ip := a; ; ip = ip.Next() {
		ips = append(ips, net.IP(ip.AsSlice()))
		if ip == b || len(ips) > 1<<16 {
			break
		}
	}
	return &SourceAddrs{ips: ips}, nil
}

// Len is the number of source addresses (0: the kernel chooses).
func (s *SourceAddrs) Len() int {
	if s == nil {
		return 0
	}
	return len(s.ips)
}

// Next returns the next source address, or nil when there is none.
func (s *SourceAddrs) Next() net.IP {
	if s.Len() == 0 {
		return nil
	}
	return s.ips[(s.next.Add(1)-1)%uint64(len(s.ips))]
}

// DialContext dials addr from the next source address when addr is an IPv4
// loopback destination (and lets the kernel choose otherwise). It has the
// signature of http.Transport.DialContext.
func (s *SourceAddrs) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: -1}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() && ip.IsLoopback() {
			if src := s.Next(); src != nil {
				d.LocalAddr = &net.TCPAddr{IP: src}
			}
		}
	}
	return d.DialContext(ctx, network, addr)
}

// NewHTTPClient returns a client for REST calls that dials from src and
// keeps up to maxConns connections to the target. Requests time out after
// timeout (zero value means 30s).
func NewHTTPClient(src *SourceAddrs, maxConns int, timeout time.Duration) *http.Client {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         src.DialContext,
			MaxIdleConns:        maxConns,
			MaxIdleConnsPerHost: maxConns,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		},
		// Redirects could leave loopback.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// newWSHTTPClient is the transport WebSocket handshakes use (an upgraded
// connection never returns to the pool) with no client timeout:
// coder/websocket bounds the handshake with the dial context.
func newWSHTTPClient(src *SourceAddrs) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := src.DialContext(ctx, network, addr)
		if s, ok := ctx.Value(rawConnKey{}).(*rawConnSlot); ok && err == nil {
			s.set(c)
		}
		return c, err
	}
	return &http.Client{
		// No keep-alive: every handshake dials a connection of its own,
		// so the one a Dial's rawConnSlot holds is the one its WebSocket
		// runs on (an idle connection is never handed to another Dial).
		Transport:     &http.Transport{DialContext: dial, DisableCompression: true, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// rawConnKey is the context key of a Dial's rawConnSlot.
type rawConnKey struct{}

// rawConnSlot receives the TCP connection the transport dials for one
// WebSocket handshake. Closing it is the only way to end a connection
// whose close handshake is waiting on a peer that stopped answering:
// the WebSocket library's own CloseNow waits for that handshake.
type rawConnSlot struct {
	mu sync.Mutex // guards c
	c  net.Conn
}

func (s *rawConnSlot) set(c net.Conn) {
	s.mu.Lock()
	s.c = c
	s.mu.Unlock()
}

func (s *rawConnSlot) get() net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c
}
