package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/segmentio/encoding/json"
)

// ServerStats is a target's process memory as the target reports it.
type ServerStats struct {
	HeapInuse, StackInuse uint64
	RSS                   uint64
	Goroutines            int
	// GCForced is true when the numbers were read right after a forced GC
	// (/debug/memstats); Prometheus gauges carry whatever the last GC left.
	GCForced bool
	// Source is the endpoint the numbers came from.
	Source string
}

// ReadServerStats reads base/debug/memstats (the JSON the baseline serves:
// memory after a forced GC) or, failing that, the Go runtime and process
// gauges of base/metrics (Prometheus text: go_memstats_heap_inuse_bytes,
// go_memstats_stack_inuse_bytes, go_goroutines,
// process_resident_memory_bytes). A server that also serves net/http/pprof
// (Centrifugo with debug on) is made to collect first, through a heap
// profile taken after a GC, so its gauges are after a GC too (GCForced).
func ReadServerStats(ctx context.Context, client *http.Client, base string) (ServerStats, error) {
	if st, err := readMemstats(ctx, client, base+"/debug/memstats"); err == nil {
		return st, nil
	}
	_, gcErr := get(ctx, client, base+"/debug/pprof/heap?gc=1")
	st, err := readPromStats(ctx, client, base+"/metrics")
	st.GCForced = err == nil && gcErr == nil
	return st, err
}

func get(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return b, nil
}

func readMemstats(ctx context.Context, client *http.Client, url string) (ServerStats, error) {
	b, err := get(ctx, client, url)
	if err != nil {
		return ServerStats{}, err
	}
	var m struct {
		HeapInuse  *uint64 `json:"heapInuse"`
		StackInuse *uint64 `json:"stackInuse"`
		RSS        uint64  `json:"rssBytes"`
		Goroutines int     `json:"goroutines"`
		GCForced   bool    `json:"gcForced"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.HeapInuse == nil || m.StackInuse == nil {
		return ServerStats{}, fmt.Errorf("GET %s: not a memstats document", url)
	}
	return ServerStats{HeapInuse: *m.HeapInuse, StackInuse: *m.StackInuse, RSS: m.RSS, Goroutines: m.Goroutines,
		GCForced: m.GCForced, Source: "/debug/memstats"}, nil
}

func readPromStats(ctx context.Context, client *http.Client, url string) (ServerStats, error) {
	b, err := get(ctx, client, url)
	if err != nil {
		return ServerStats{}, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return ServerStats{}, fmt.Errorf("GET %s: not Prometheus text: %w", url, err)
	}
	heap, okHeap := firstValue(fams["go_memstats_heap_inuse_bytes"])
	stack, okStack := firstValue(fams["go_memstats_stack_inuse_bytes"])
	if !okHeap || !okStack {
		return ServerStats{}, fmt.Errorf("GET %s: no go_memstats_heap_inuse_bytes / go_memstats_stack_inuse_bytes", url)
	}
	st := ServerStats{Source: "/metrics", HeapInuse: uint64(heap), StackInuse: uint64(stack)}
	if v, ok := firstValue(fams["go_goroutines"]); ok {
		st.Goroutines = int(v)
	}
	if v, ok := firstValue(fams["process_resident_memory_bytes"]); ok {
		st.RSS = uint64(v)
	}
	return st, nil
}

// firstValue is the value of the family's first sample (a gauge, or an
// untyped sample as exposed without a TYPE line).
func firstValue(f *dto.MetricFamily) (float64, bool) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	m := f.GetMetric()[0]
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}
