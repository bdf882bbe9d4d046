package loadtest_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/han-app/gateway/loadtest"
)

func TestOnlyLoopbackTargets(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:8080", "http://127.9.9.9:1", "http://[::1]:8080", "http://localhost:8080",
		"ws://127.0.0.1/v1/realtime", "redis://user:pw@127.0.0.1:6379/1"} {
		if _, err := loadtest.CheckLoopbackURL(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"http://10.0.0.1:8080", "http://example.com", "http://192.168.1.2:80", "http://[::2]:80",
		"http://0.0.0.0:8080", "http://127.0.0.1.example.com/", "redis://user:secretpw@10.1.2.3:6379/1", "not a url"} {
		_, err := loadtest.CheckLoopbackURL(bad)
		if err == nil {
			t.Errorf("%s accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), "secretpw") {
			t.Errorf("error leaks the password: %v", err)
		}
		if bad != "not a url" && !errors.Is(err, loadtest.ErrNotLoopback) {
			t.Errorf("%s: %v, want ErrNotLoopback", bad, err)
		}
	}
	// A Redis Cluster URL's addr= seeds are dialled too (the broadcast
	// publisher's cluster client): every one must be loopback.
	if _, err := loadtest.CheckLoopbackURL("redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=[::1]:7002"); err != nil {
		t.Errorf("a loopback cluster URL refused: %v", err)
	}
	for _, bad := range []string{"redis://127.0.0.1:6379?addr=10.1.2.3:6379", "redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=example.com:7002"} {
		if _, err := loadtest.CheckLoopbackURL(bad); !errors.Is(err, loadtest.ErrNotLoopback) {
			t.Errorf("%s: %v, want ErrNotLoopback", bad, err)
		}
	}
	if _, err := loadtest.NewAPI("http://10.0.0.1:8080", nil, loadtest.NewRegistry()); err == nil {
		t.Error("NewAPI accepted a remote target")
	}
}

// Clients spread over the source pool, so tens of thousands of connections
// to one port do not run out of ephemeral ports.
func TestDialsSpreadOverSourceAddresses(t *testing.T) {
	src, err := loadtest.ParseSourceRange("127.0.0.2-127.0.0.5")
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 4 {
		t.Fatalf("len = %d, want 4", src.Len())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := map[string]int{}
	for range 8 {
		c, err := src.DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		seen[s.RemoteAddr().(*net.TCPAddr).IP.String()]++
		s.Close()
		c.Close()
	}
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		if seen[ip] != 2 {
			t.Errorf("server saw %v, want each of 127.0.0.2..5 twice", seen)
			break
		}
	}
	for _, bad := range []string{"10.0.0.1-10.0.0.9", "127.0.0.9-127.0.0.2", "::1", "127.0.0.1-"} {
		if _, err := loadtest.ParseSourceRange(bad); err == nil {
			t.Errorf("range %q accepted", bad)
		}
	}
	if none, err := loadtest.ParseSourceRange("none"); err != nil || none.Len() != 0 || none.Next() != nil {
		t.Errorf("none: %v", err)
	}
}

func TestFileBudget(t *testing.T) {
	tt := &loadtest.T{FileLimit: 20000}
	if err := tt.NeedFiles(19000, 1); err != nil {
		t.Errorf("19,000 connections against a separate target must fit: %v", err)
	}
	err := tt.NeedFiles(10000, 2)
	if err == nil || !strings.Contains(err.Error(), "at most 9500") {
		t.Errorf("10,000 in-process connections: %v, want a refusal naming 9500", err)
	}
	if err := tt.NeedFiles(19600, 1); err == nil {
		t.Error("19,600 connections accepted")
	}
	if limit, err := loadtest.RaiseFileLimit(); err != nil || limit == 0 {
		t.Errorf("RaiseFileLimit = %d, %v", limit, err)
	}
}
