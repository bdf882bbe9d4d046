package main

import (
	"net/http"
	"strings"
	"testing"
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
