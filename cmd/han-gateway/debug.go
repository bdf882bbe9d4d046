package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	rpprof "runtime/pprof"
	"strconv"
	"strings"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/restapi"
)

// debugEnv switches the debug endpoints on (HAN_DEBUG_ENDPOINTS, a boolean
// read by debugEndpoints, or the -debug-endpoints flag). Off by default.
const debugEnv = "HAN_DEBUG_ENDPOINTS"

// memStats is the /debug/memstats document, the same shape the load test's
// baseline server serves (docs/loadtest.md): the process's memory right
// after a forced GC.
type memStats struct {
	HeapInuse   uint64 `json:"heapInuse"`
	StackInuse  uint64 `json:"stackInuse"`
	HeapAlloc   uint64 `json:"heapAlloc"`
	Sys         uint64 `json:"sys"`
	RSS         uint64 `json:"rssBytes"` // 0 where /proc is missing
	Goroutines  int    `json:"goroutines"`
	Connections int    `json:"connections"`
	GCForced    bool   `json:"gcForced"`
}

// withDebug serves GET /debug/memstats and /debug/pprof/… in front of next
// when enabled, and only to loopback clients: the TCP peer is loopback and
// so is the client address (a trusted proxy on loopback forwarding a remote
// client does not qualify). Anything else (debug off, a request from another
// address, a path that is no debug endpoint or an unknown profile) goes to
// next unchanged, which answers the JSON 404; other methods than GET and HEAD
// on an endpoint get the JSON 405.
// The endpoints expose process internals and runtime.GC() costs a
// stop-the-world pause, hence both guards.
func (m *Main) withDebug(next http.Handler) http.Handler {
	if !m.Debug {
		return next
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/memstats", m.memstats)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/debug/") || !loopbackPeer(r.RemoteAddr) || !m.api.ClientAddr(r).IsLoopback() {
			next.ServeHTTP(w, r)
			return
		}
		h, pattern := mux.Handler(r)
		// pprof.Index answers an unknown profile name in plain text itself.
		name, indexed := strings.CutPrefix(r.URL.Path, "/debug/pprof/")
		if pattern == "" || pattern == "/debug/pprof/" && indexed && name != "" && rpprof.Lookup(name) == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			restapi.MethodNotAllowed(w, http.MethodGet, http.MethodHead)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackPeer reports whether a RemoteAddr ("ip:port") is a loopback
// address.
func loopbackPeer(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (m *Main) memstats(w http.ResponseWriter, _ *http.Request) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := memStats{HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, HeapAlloc: ms.HeapAlloc, Sys: ms.Sys,
		RSS: readRSS(), Goroutines: runtime.NumGoroutine(), GCForced: true}
	if m.realtime != nil {
		st.Connections = m.realtime.Stats().Connections
	}
	b, _ := json.Marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// readRSS reads the resident set size from /proc/self/statm (Linux).
func readRSS() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
