package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With HAN_METRICS_ADDR the scrape endpoint moves to its own listener and the
// public API port no longer serves it.
func TestMetricsOnSeparateListener(t *testing.T) {
	vars := baseEnv()
	vars["HAN_METRICS_ADDR"] = "127.0.0.1:0"
	m := start(t, vars)
	if m.MetricsAddr() == "" || m.MetricsAddr() == m.Addr() {
		t.Fatalf("metrics address %q (API %q)", m.MetricsAddr(), m.Addr())
	}
	call(t, "GET", m.URL()+"/healthz", "", "")
	code, body := call(t, "GET", "http://"+m.MetricsAddr()+"/metrics", "", "")
	if code != 200 || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "han_http_requests_total") {
		t.Fatalf("separate /metrics: %d", code)
	}
	if code, _ := call(t, "GET", m.URL()+"/metrics", "", ""); code != http.StatusNotFound {
		t.Fatalf("the API port still serves /metrics: %d", code)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + m.MetricsAddr() + "/metrics"); err == nil {
		t.Fatal("metrics listener still up after Close")
	}
}

// The metrics listener holds no connection for ever: a scraper (or anyone
// who reaches the port) that keeps a connection open after its scrape is
// closed after HAN_HTTP_IDLE_TIMEOUT, as on the API port, so idle
// connections cannot pile up and use the descriptors the API and the pools
// need.
func TestMetricsListenerClosesIdleConnections(t *testing.T) {
	vars := baseEnv()
	vars["HAN_METRICS_ADDR"] = "127.0.0.1:0"
	vars["HAN_HTTP_IDLE_TIMEOUT"] = "1s"
	m := start(t, vars)
	c, err := net.Dial("tcp", m.MetricsAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection after a scrape: read %v after %v, want EOF from the server within HAN_HTTP_IDLE_TIMEOUT", err, time.Since(began).Round(time.Millisecond))
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("idle connection closed after %v, want about 1s", d)
	}
}
