package restapi

import (
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"testing"
)

// The client address behind trusted proxies: right-most untrusted hop of
// the one header the proxies write, nothing believed from untrusted
// peers, and no way for a client to pick its address by adding the other
// forwarding header (not even to make its trusted loopback proxy's own
// address count as the client: the debug endpoints ask for loopback).
func TestClientAddrTrustsOnlyConfiguredProxies(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("127.0.0.1/32")}
	xff := &Server{cfg: Config{TrustedProxies: trusted}}
	rfc := &Server{cfg: Config{TrustedProxies: trusted, ForwardedHeader: "forwarded"}}
	cases := []struct {
		name string
		s    *Server
		peer string
		hdr  map[string]string
		want string
	}{
		{"untrusted peer, headers ignored", xff, "192.0.2.1:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=198.51.100.9"}, "192.0.2.1"},
		{"untrusted peer, Forwarded ignored", rfc, "192.0.2.1:5000", map[string]string{"Forwarded": "for=198.51.100.9"}, "192.0.2.1"},
		{"trusted peer, no headers", xff, "10.0.0.2:5000", nil, "10.0.0.2"},
		{"right-most untrusted hop", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "203.0.113.66, 198.51.100.9, 10.1.1.1"}, "198.51.100.9"},
		{"all hops trusted", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"garbage hop stops at the last trusted", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9, nonsense"}, "10.0.0.2"},
		{"Forwarded with port and quotes", rfc, "[2001:db8::1]:443", map[string]string{"Forwarded": `for=203.0.113.66, for="[2001:db8:cafe::17]:4711", for="198.51.100.9:80";proto=https`}, "198.51.100.9"},
		{"the client's own Forwarded is ignored", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=203.0.113.66"}, "198.51.100.9"},
		{"the client's own X-Forwarded-For is ignored", rfc, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=203.0.113.66"}, "203.0.113.66"},
		{"Forwarded alone from an X-Forwarded-For proxy", xff, "10.0.0.2:5000", map[string]string{"Forwarded": "for=203.0.113.66"}, "10.0.0.2"},
		{"a loopback proxy's client stays remote", xff, "127.0.0.1:40000", map[string]string{"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.1"}, "203.0.113.7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.peer
			for k, v := range c.hdr {
				r.Header.Set(k, v)
			}
			if got := c.s.ClientAddr(r); got.String() != c.want {
				t.Fatalf("client address %s, want %s", got, c.want)
			}
		})
	}
	s := xff
	r, _ := http.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:5000"
	r.Header.Set("X-Forwarded-Proto", "https")
	if s.requestScheme(r) != "http" {
		t.Fatal("an untrusted peer chose the scheme")
	}
	r.RemoteAddr = "10.0.0.2:5000"
	if s.requestScheme(r) != "https" {
		t.Fatal("a trusted proxy's X-Forwarded-Proto is ignored")
	}
	if rfc.requestScheme(r) != "http" {
		t.Fatal("X-Forwarded-Proto chose the scheme behind proxies that write Forwarded")
	}
	r.Header.Set("Forwarded", "for=198.51.100.9;proto=https")
	r.Header.Del("X-Forwarded-Proto")
	if rfc.requestScheme(r) != "https" || s.requestScheme(r) != "http" {
		t.Fatal("Forwarded proto= must count only behind proxies that write Forwarded")
	}
	for host, want := range map[string]bool{"127.0.0.1:8080": true, "localhost": true, "[::1]:80": true, "127.9.9.9": true,
		"evil.example": false, "localhost.evil.example": false, "127.0.0.1:80/x": false, "10.0.0.1:8080": false} {
		if loopbackHost(host) != want {
			t.Errorf("loopbackHost(%q) = %v", host, !want)
		}
	}
}

// An IPv6 client is counted as its /64 (a host may rotate addresses inside
// the /64 its network gives it); an IPv4 client as its address.
func TestIPv6ClientsAreCountedByTheirSlash64(t *testing.T) {
	for in, want := range map[string]string{
		"198.51.100.9":             "198.51.100.9",
		"2001:db8:2f2a:77::1":      "2001:db8:2f2a:77::/64",
		"2001:db8:2f2a:77:abcd::9": "2001:db8:2f2a:77::/64",
		"2001:db8:2f2a:78::1":      "2001:db8:2f2a:78::/64",
	} {
		if got := clientNet(netip.MustParseAddr(in)); got != want {
			t.Errorf("clientNet(%s) = %s, want %s", in, got, want)
		}
	}
}

// A client of a trusted proxy writes as much of the forwarding header as
// the header limit lets it (tens of thousands of hops in 64 KiB); the proxy
// appends the address it saw. Finding the client costs what the hops right
// of it cost, not what the client wrote: the walk from the right never
// splits the rest. (Splitting every hop first cost about 3 MB and
// milliseconds per call, and every request asks more than once.)
func TestAHugeForwardingHeaderCostsOnlyTheHopsWalked(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []struct {
		s      *Server
		header string
		filler string
		last   string
	}{
		{&Server{cfg: Config{TrustedProxies: trusted}}, "X-Forwarded-For", "1,", "198.51.100.9, 10.1.1.1"},
		{&Server{cfg: Config{TrustedProxies: trusted, ForwardedHeader: "forwarded"}}, "Forwarded", "for=1,", "for=198.51.100.9, for=10.1.1.1"},
	} {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.2:5000"
		r.Header.Set(c.header, strings.Repeat(c.filler, 60<<10/len(c.filler))+c.last)
		if a := c.s.ClientAddr(r); a != netip.MustParseAddr("198.51.100.9") {
			t.Fatalf("%s: ClientAddr = %s, want 198.51.100.9", c.header, a)
		}
		const calls = 20
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range calls {
			c.s.ClientAddr(r)
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / calls; per > 4<<10 {
			t.Errorf("%s of 60 KiB, client 2 hops from the right: ClientAddr allocates %d bytes a call, want what those 2 hops cost", c.header, per)
		}
	}
}
