// Package faultproxy is a loopback TCP proxy for fault tests: it sits between
// the service and its redis-server and can add latency, blackhole traffic
// (a partition: bytes vanish, nothing is reset), hold back one request on
// the link that sends it, lose the replies to one request and all after it
// on its link, refuse new connections and cut the open ones.
//
// All methods are safe for concurrent use. Close stops the listener, cuts
// every link and waits for the proxy's goroutines.
package faultproxy

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections accepted on a loopback port to one target.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex // guards the fields below
	latency   time.Duration
	blackhole bool
	muteReply bool
	refuse    bool
	closed    bool
	links     map[net.Conn]struct{}
	dials     []time.Time // every accepted connection attempt, refused ones too
	holds     []*hold     // every HoldRequest; the last one is the one in force
	muteAfter *muteAfter  // the MuteRepliesAfter in force, nil when none

	wg sync.WaitGroup
}

// Start listens on 127.0.0.1 (a free port) and forwards to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// TB is what ForURL needs of a test (testing.TB has it).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(f func())
}

// ForURL starts a proxy to the host of rawURL (a postgres:// or redis://
// URL), closed when the test ends, and returns it with rawURL pointing at
// it instead: a client opened with that URL goes through the proxy.
func ForURL(t TB, rawURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every forwarded chunk, both ways, by d (0 turns it off).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Blackhole makes the proxy swallow every byte in both directions while on:
// connections stay open and silent, as in a network partition.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	p.mu.Unlock()
}

// MuteReplies makes the proxy swallow every byte from the target while on,
// and forward the client's: requests arrive and run, their answers are
// lost (a COMMIT that commits and never says so).
func (p *Proxy) MuteReplies(on bool) {
	p.mu.Lock()
	p.muteReply = on
	p.mu.Unlock()
}

// muteAfter is a MuteRepliesAfter: seen once the marked chunk arrived.
type muteAfter struct {
	marker []byte
	seen   chan struct{}
}

// MuteRepliesAfter loses every reply on the one link whose client next
// sends a chunk containing marker: that chunk and what follows reach the
// target and run there, but nothing the target sends back on that link
// arrives any more (a COMMIT that commits and never says so, however long
// the client takes to send it). Every other link keeps flowing, so the
// client can go on with new connections. seen is closed once the chunk
// arrived. A later call replaces one that has not caught its chunk yet.
func (p *Proxy) MuteRepliesAfter(marker []byte) (seen <-chan struct{}) {
	m := &muteAfter{marker: bytes.Clone(marker), seen: make(chan struct{})}
	p.mu.Lock()
	p.muteAfter = m
	p.mu.Unlock()
	return m.seen
}

// mutes reports whether b, sent by a client, is the chunk a MuteRepliesAfter
// waits for; if so the rule is spent.
func (p *Proxy) mutes(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.muteAfter
	if m == nil || !bytes.Contains(b, m.marker) {
		return false
	}
	p.muteAfter = nil
	close(m.seen)
	return true
}

// Refuse makes the proxy close new connections at once while on.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// hold is a HoldRequest: seen once the marked chunk arrived.
type hold struct {
	marker  []byte
	seen    bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *hold) free() { h.once.Do(func() { close(h.release) }) }

// HoldRequest holds back the first chunk a client sends that contains
// marker, and with it everything that client sends after it on the same
// link, until release is called; the link's replies keep flowing, and so
// does every other link. It is a request stuck on its way, on one
// connection only (a SUBSCRIBE on the Pub/Sub connection, say, while the
// pool's commands go through). held is closed once the chunk arrived. A
// later call replaces a hold that has not caught its chunk yet; Close
// releases every hold.
func (p *Proxy) HoldRequest(marker []byte) (held <-chan struct{}, release func()) {
	h := &hold{marker: bytes.Clone(marker), held: make(chan struct{}), release: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		h.free()
	}
	p.holds = append(p.holds, h)
	p.mu.Unlock()
	return h.held, h.free
}

// caught is the hold whose marker chunk is b, if any (only its first
// sighting counts).
func (p *Proxy) caught(b []byte) *hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.holds) == 0 {
		return nil
	}
	h := p.holds[len(p.holds)-1]
	if h.seen || !bytes.Contains(b, h.marker) {
		return nil
	}
	h.seen = true
	close(h.held)
	return h
}

// Cut closes every open link (both sides see a reset/EOF).
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.links {
		c.Close()
	}
	p.mu.Unlock()
}

// Dials returns the time of every connection attempt accepted so far.
func (p *Proxy) Dials() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.dials...)
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for _, h := range p.holds {
		h.free()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.dials = append(p.dials, time.Now())
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			continue
		}
		p.wg.Add(2)
		l := &link{}
		go p.pipe(c, up, l, false)
		go p.pipe(up, c, l, true)
	}
}

func (p *Proxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		a.Close()
		b.Close()
		return false
	}
	p.links[a], p.links[b] = struct{}{}, struct{}{}
	return true
}

func (p *Proxy) untrack(a, b net.Conn) {
	p.mu.Lock()
	delete(p.links, a)
	delete(p.links, b)
	p.mu.Unlock()
	a.Close()
	b.Close()
}

// link is the state the two directions of one proxied connection share.
type link struct {
	// muted: the client sent the chunk of a MuteRepliesAfter; no reply
	// is forwarded any more.
	muted atomic.Bool
}

// pipe copies src to dst, applying the faults in force for each chunk;
// reply is the direction from the target.
func (p *Proxy) pipe(src, dst net.Conn, l *link, reply bool) {
	defer p.wg.Done()
	defer p.untrack(src, dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat, hole := p.latency, p.blackhole || (reply && (p.muteReply || l.muted.Load()))
			p.mu.Unlock()
			if lat > 0 {
				time.Sleep(lat)
			}
			if !reply {
				if h := p.caught(buf[:n]); h != nil {
					<-h.release
				}
				if p.mutes(buf[:n]) {
					// Before the chunk goes on: its reply cannot come first.
					l.muted.Store(true)
				}
			}
			if !hole {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
