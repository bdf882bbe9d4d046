package restapi

import (
	"net/http"
	"net/netip"
	"testing"
)

// The client address behind trusted proxies: right-most untrusted hop,
// nothing believed from untrusted peers, and no way for a client to pick
// its address by adding a second forwarding header.
func TestClientAddrTrustsOnlyConfiguredProxies(t *testing.T) {
	s := &Server{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}}}
	cases := []struct {
		name, peer string
		hdr        map[string]string
		want       string
	}{
		{"untrusted peer, headers ignored", "192.0.2.1:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=198.51.100.9"}, "192.0.2.1"},
		{"trusted peer, no headers", "10.0.0.2:5000", nil, "10.0.0.2"},
		{"right-most untrusted hop", "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "203.0.113.66, 198.51.100.9, 10.1.1.1"}, "198.51.100.9"},
		{"all hops trusted", "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"garbage hop stops at the last trusted", "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9, nonsense"}, "10.0.0.2"},
		{"Forwarded with port and quotes", "[2001:db8::1]:443", map[string]string{"Forwarded": `for=203.0.113.66, for="[2001:db8:cafe::17]:4711", for="198.51.100.9:80";proto=https`}, "198.51.100.9"},
		{"both headers agree", "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=198.51.100.9"}, "198.51.100.9"},
		{"both headers disagree", "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.9", "Forwarded": "for=203.0.113.66"}, "10.0.0.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.peer
			for k, v := range c.hdr {
				r.Header.Set(k, v)
			}
			if got := s.ClientAddr(r); got.String() != c.want {
				t.Fatalf("client address %s, want %s", got, c.want)
			}
		})
	}
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
	for host, want := range map[string]bool{"127.0.0.1:8080": true, "localhost": true, "[::1]:80": true, "127.9.9.9": true,
		"evil.example": false, "localhost.evil.example": false, "127.0.0.1:80/x": false, "10.0.0.1:8080": false} {
		if loopbackHost(host) != want {
			t.Errorf("loopbackHost(%q) = %v", host, !want)
		}
	}
}
