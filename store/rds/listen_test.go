package rds_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// listenSocket is one LISTEN entry of /proc/net/tcp or /proc/net/tcp6.
type listenSocket struct {
	addr netip.Addr
	port int
}

// listeningSockets parses the kernel's socket tables (no dialling).
func listeningSockets(t *testing.T) []listenSocket {
	t.Helper()
	var out []listenSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			if f == "/proc/net/tcp6" && os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A = TCP_LISTEN
				continue
			}
			host, port, ok := strings.Cut(fields[1], ":")
			if !ok {
				t.Fatalf("%s: bad local address %q", f, fields[1])
			}
			p, err := strconv.ParseUint(port, 16, 16)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, listenSocket{addr: procAddr(t, host), port: int(p)})
		}
		fh.Close()
	}
	return out
}

// procAddr decodes a /proc/net address: 32-bit words in host (little-endian) order.
func procAddr(t *testing.T, h string) netip.Addr {
	t.Helper()
	if len(h) != 8 && len(h) != 32 {
		t.Fatalf("bad /proc/net address %q", h)
	}
	b := make([]byte, len(h)/2)
	for i := 0; i < len(h); i += 8 {
		w, err := strconv.ParseUint(h[i:i+8], 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		j := i / 2
		b[j], b[j+1], b[j+2], b[j+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap()
}

func TestProcAddrDecoding(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F":                         "127.0.0.1",
		"00000000":                         "0.0.0.0",
		"0A00000A":                         "10.0.0.10",
		"00000000000000000000000001000000": "::1",
		"0000000000000000FFFF00000100007F": "127.0.0.1",
	} {
		if got := procAddr(t, in).String(); got != want {
			t.Errorf("procAddr(%s) = %s, want %s", in, got, want)
		}
	}
}

// Redis is not reachable from the host's public network, checked on the
// kernel's listening sockets (never by dialling a non-loopback address):
// the harness's redis-server — started with the dev stack's flags — listens
// on loopback only; the dev stack binds 127.0.0.1 and leaves protected mode
// on; deploy/redis.conf binds loopback and private addresses only, with
// protected mode on.
func TestRedisListensOnlyOnLoopback(t *testing.T) {
	var found int
	for _, s := range listeningSockets(t) {
		if s.port != env.Redis.Port {
			continue
		}
		found++
		if !s.addr.IsLoopback() {
			t.Errorf("redis-server listens on %s:%d, outside loopback", s.addr, s.port)
		}
	}
	if found == 0 {
		t.Fatalf("no listening socket for redis-server's port %d", env.Redis.Port)
	}

	dev, err := os.ReadFile("../../scripts/dev.sh")
	if err != nil {
		t.Fatal(err)
	}
	var cmd string
	for _, l := range strings.Split(string(dev), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "redis-server ") {
			cmd = l
		}
	}
	if cmd == "" {
		t.Fatal("scripts/dev.sh starts no redis-server")
	}
	if !regexp.MustCompile(`--bind 127\.0\.0\.1(\s|$)`).MatchString(cmd) {
		t.Errorf("scripts/dev.sh: redis-server must bind 127.0.0.1 only: %s", cmd)
	}
	if strings.Contains(string(dev), "protected-mode no") {
		t.Error("scripts/dev.sh turns protected mode off")
	}

	conf, err := os.ReadFile("../../deploy/redis.conf")
	if err != nil {
		t.Fatal(err)
	}
	directives := map[string][]string{}
	for _, l := range strings.Split(string(conf), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		directives[strings.ToLower(f[0])] = f[1:]
	}
	if err := checkBind(directives["bind"]); err != nil {
		t.Errorf("deploy/redis.conf: %v", err)
	}
	if pm := directives["protected-mode"]; len(pm) != 1 || pm[0] != "yes" {
		t.Errorf("deploy/redis.conf: protected-mode %v, want yes", pm)
	}
	for name, want := range map[string]string{"appendonly": "yes", "appendfsync": "everysec",
		"aof-load-truncated": "yes", "maxmemory-policy": "volatile-lru"} {
		if v := directives[name]; len(v) != 1 || v[0] != want {
			t.Errorf("deploy/redis.conf: %s %v, want %s", name, v, want)
		}
	}
}

// checkBind accepts loopback and private (RFC 1918 / ULA) addresses only.
func checkBind(addrs []string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("no bind directive: redis-server would listen on every interface")
	}
	for _, a := range addrs {
		ip, err := netip.ParseAddr(strings.TrimPrefix(a, "-"))
		if err != nil {
			return fmt.Errorf("bind %q is not an address", a)
		}
		if !ip.IsLoopback() && !ip.IsPrivate() {
			return fmt.Errorf("bind %s is neither loopback nor private", ip)
		}
	}
	return nil
}

func TestCheckBindRejectsPublicAndWildcard(t *testing.T) {
	for _, bad := range [][]string{nil, {"0.0.0.0"}, {"*"}, {"::"}, {"127.0.0.1", "203.0.113.5"}} {
		if checkBind(bad) == nil {
			t.Errorf("bind %v accepted", bad)
		}
	}
	if err := checkBind([]string{"127.0.0.1", "10.0.0.10", "-::1"}); err != nil {
		t.Error(err)
	}
}
