package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

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
// process_resident_memory_bytes).
func ReadServerStats(ctx context.Context, client *http.Client, base string) (ServerStats, error) {
	if st, err := readMemstats(ctx, client, base+"/debug/memstats"); err == nil {
		return st, nil
	}
	return readPromStats(ctx, client, base+"/metrics")
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
	st := ServerStats{Source: "/metrics"}
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_memstats_heap_inuse_bytes":
			st.HeapInuse, found = uint64(f), found+1
		case "go_memstats_stack_inuse_bytes":
			st.StackInuse, found = uint64(f), found+1
		case "go_goroutines":
			st.Goroutines = int(f)
		case "process_resident_memory_bytes":
			st.RSS = uint64(f)
		}
	}
	if found < 2 {
		return st, fmt.Errorf("GET %s: no go_memstats_heap_inuse_bytes / go_memstats_stack_inuse_bytes", url)
	}
	return st, nil
}
