package connlimit

import (
	"net/netip"
	"testing"
)

// The per-address cap counts an IPv6 peer's /64: a host that opens each
// connection from another address of its /64 is still one peer.
func TestAnIPv6PeerIsCountedByItsSlash64(t *testing.T) {
	l := New(nil, Config{Max: 100, PerIP: 2})
	for i, a := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9"} {
		if r := l.acquire(netip.MustParseAddr(a)); r != "" {
			t.Fatalf("connection %d of the /64 refused: %s", i+1, r)
		}
	}
	if r := l.acquire(netip.MustParseAddr("2001:db8:1:2::77")); r != "per_ip" {
		t.Fatalf("a third address of the same /64 got %q, want the per-address cap", r)
	}
	if r := l.acquire(netip.MustParseAddr("2001:db8:1:3::1")); r != "" {
		t.Fatalf("another /64 refused: %s", r)
	}
	l.release(netip.MustParseAddr("2001:db8:1:2::1"))
	if r := l.acquire(netip.MustParseAddr("2001:db8:1:2::abc")); r != "" {
		t.Fatalf("after one of the /64's connections closed, another address of it was refused: %s", r)
	}
	for i, a := range []string{"198.51.100.1", "198.51.100.1"} {
		if r := l.acquire(netip.MustParseAddr(a)); r != "" {
			t.Fatalf("IPv4 connection %d refused: %s", i+1, r)
		}
	}
	if r := l.acquire(netip.MustParseAddr("198.51.100.2")); r != "" {
		t.Fatalf("a neighbouring IPv4 address shares a cap: %s", r)
	}
}

// A trusted proxy is not counted against the per-address cap, so its
// connections closing uncount nothing: not the untrusted hosts of the /64
// it shares, which stay at their cap.
func TestATrustedProxyClosingDoesNotUncountItsSlash64(t *testing.T) {
	proxy := netip.MustParseAddr("2001:db8:1:2::1")
	l := New(nil, Config{Max: 100, PerIP: 2, Unlimited: []netip.Prefix{netip.PrefixFrom(proxy, 128)}})
	for range 2 {
		if r := l.acquire(proxy); r != "" {
			t.Fatalf("the proxy was refused: %s", r)
		}
	}
	client := netip.MustParseAddr("2001:db8:1:2::99")
	for i := range 2 {
		if r := l.acquire(client); r != "" {
			t.Fatalf("client connection %d refused: %s", i+1, r)
		}
	}
	l.release(proxy)
	l.release(proxy)
	if r := l.acquire(client); r != "per_ip" {
		t.Fatalf("a third connection of a client at its cap got %q after the proxy's closed, want per_ip", r)
	}
}
