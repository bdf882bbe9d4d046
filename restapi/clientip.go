package restapi

import (
	"iter"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// ClientAddr is the one place that decides who the client of a request is
// and which scheme it used; the access log, the rate-limit family "ip",
// the budget of refused credentials (authfail.go), /v1/public/config and
// the loopback-only debug endpoints all ask it.
//
// The TCP peer is the client unless it is a trusted proxy
// (Config.TrustedProxies). Then the hops the proxy reported in the one
// header trusted proxies write (Config.ForwardedHeader: X-Forwarded-For, or
// Forwarded) are walked from the right (nearest first), skipping trusted
// proxies; the first other address is the client. The other header is
// ignored: the proxy did not write it, so the client did, and believing it
// (even only to doubt the first) would let a client choose what it is
// counted as — another rate-limit bucket, or the proxy's own loopback
// address. Forwarding headers from an untrusted peer are ignored.
func (s *Server) ClientAddr(r *http.Request) netip.Addr {
	peer := peerAddr(r)
	if !peer.IsValid() || !s.trusted(peer) {
		return peer
	}
	hops := xForwardedFor(r.Header)
	if s.forwardedRFC() {
		hops = forwardedFor(r.Header)
	}
	if a, ok := s.hopClient(peer, hops); ok {
		return a
	}
	return peer
}

// forwardedRFC reports whether trusted proxies write the RFC 7239
// Forwarded header rather than X-Forwarded-For and X-Forwarded-Proto.
func (s *Server) forwardedRFC() bool { return s.cfg.ForwardedHeader == "forwarded" }

// requestScheme is "https" when the client used TLS: on this connection, or
// as reported by a trusted proxy (X-Forwarded-Proto, or Forwarded proto=
// when that is the header the proxies write).
func (s *Server) requestScheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	if p := peerAddr(r); !p.IsValid() || !s.trusted(p) {
		return "http"
	}
	var proto string
	if !s.forwardedRFC() {
		proto = lastElem(r.Header.Values("X-Forwarded-Proto"))
	} else {
		for _, pair := range strings.Split(lastElem(r.Header.Values("Forwarded")), ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(pair), "="); ok && strings.EqualFold(k, "proto") {
				proto = strings.Trim(v, `"`)
			}
		}
	}
	if strings.EqualFold(strings.TrimSpace(proto), "https") {
		return "https"
	}
	return "http"
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// hopClient walks hops, nearest first. It returns false when there are no
// hops. An entry that is not an address ends the walk at the last address
// established, which is a trusted proxy.
//
// hops yields one hop at a time, from the right: everything left of the
// client's own address was written by the client, up to the header size
// limit (tens of thousands of entries in 64 KiB), and is never looked at.
// Splitting the whole header first cost milliseconds and megabytes per
// call, several calls per request, for a client of a trusted proxy.
func (s *Server) hopClient(peer netip.Addr, hops iter.Seq[string]) (netip.Addr, bool) {
	last, seen := peer, false
	for hop := range hops {
		seen = true
		a, ok := parseHop(hop)
		if !ok {
			return last, true
		}
		if !s.trusted(a) {
			return a, true
		}
		last = a
	}
	if !seen {
		return netip.Addr{}, false
	}
	return last, true
}

func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// xForwardedFor yields the hops of X-Forwarded-For, nearest first.
func xForwardedFor(h http.Header) iter.Seq[string] {
	return func(yield func(string) bool) {
		for elem := range fromRight(h.Values("X-Forwarded-For")) {
			if !yield(strings.TrimSpace(elem)) {
				return
			}
		}
	}
}

// forwardedFor yields the for= parameters of the Forwarded header
// (RFC 7239), one per element, nearest first; an element without for= is
// an unknown hop.
func forwardedFor(h http.Header) iter.Seq[string] {
	return func(yield func(string) bool) {
		for elem := range fromRight(h.Values("Forwarded")) {
			hop := "unknown"
			for pair := range strings.SplitSeq(elem, ";") {
				if k, val, ok := strings.Cut(strings.TrimSpace(pair), "="); ok && strings.EqualFold(k, "for") {
					hop = strings.Trim(val, `"`)
				}
			}
			if !yield(hop) {
				return
			}
		}
	}
}

// fromRight yields the comma-separated elements of the header values, the
// last element of the last value first, without splitting what is never
// reached.
func fromRight(values []string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := len(values) - 1; i >= 0; i-- {
			v := values[i]
			for {
				j := strings.LastIndexByte(v, ',')
				if !yield(v[j+1:]) {
					return
				}
				if j < 0 {
					break
				}
				v = v[:j]
			}
		}
	}
}

// parseHop accepts "addr", "addr:port", "[v6]" and "[v6]:port".
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func lastElem(values []string) string {
	if len(values) == 0 {
		return ""
	}
	v := values[len(values)-1]
	return strings.TrimSpace(v[strings.LastIndexByte(v, ',')+1:])
}

// loopbackHost reports whether a Host header names this machine's
// loopback (127.0.0.0/8, ::1 or localhost), with or without a port.
func loopbackHost(host string) bool {
	h := host
	if hh, port, err := net.SplitHostPort(host); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		h = hh
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}
