package loadtest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"runtime/metrics"
	"testing"

	"github.com/han-app/gateway/loadtest"
)

// A target without /debug/memstats is read from its /metrics, in any valid
// exposition: HELP/TYPE lines, labels, exponent notation and timestamps.
func TestReadServerStatsFromPrometheusText(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(`# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.2582912e+07 1700000000000
# TYPE go_memstats_stack_inuse_bytes gauge
go_memstats_stack_inuse_bytes{instance="gw1"} 655360
process_resident_memory_bytes 3.3554432e+07
`))
	}))
	defer srv.Close()
	st, err := loadtest.ReadServerStats(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	want := loadtest.ServerStats{HeapInuse: 12582912, StackInuse: 655360, RSS: 33554432, Goroutines: 42, Source: "/metrics"}
	if st != want {
		t.Fatalf("ReadServerStats = %+v, want %+v", st, want)
	}
}

// A server that serves net/http/pprof besides /metrics collects before the
// reading: the heap profile is asked for after a GC.
func TestReadServerStatsForcesAGCThroughPprof(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/debug/pprof/heap", pprof.Handler("heap"))
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("go_memstats_heap_inuse_bytes 100\ngo_memstats_stack_inuse_bytes 10\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	before := forcedGCs()
	st, err := loadtest.ReadServerStats(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !st.GCForced || st.HeapInuse != 100 || st.StackInuse != 10 {
		t.Fatalf("ReadServerStats = %+v, want the /metrics figures after a forced GC", st)
	}
	if after := forcedGCs(); after <= before {
		t.Fatalf("forced GC cycles %d → %d: no GC was forced", before, after)
	}
}

func forcedGCs() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A /metrics without the Go runtime gauges is an error, not zeros.
func TestReadServerStatsNeedsTheRuntimeGauges(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("go_goroutines 3\n"))
	}))
	defer srv.Close()
	if st, err := loadtest.ReadServerStats(context.Background(), srv.Client(), srv.URL); err == nil {
		t.Fatalf("ReadServerStats = %+v without heap/stack gauges", st)
	}
}
