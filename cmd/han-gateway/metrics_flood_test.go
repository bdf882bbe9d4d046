package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
)

// infoCalls is how many INFO commands the Redis server has run.
func infoCalls(t *testing.T, r *testenv.RedisServer) int {
	t.Helper()
	c := r.AdminClient(0)
	defer c.Close()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(s, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_info:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// /metrics answers anyone who reaches the API port when HAN_METRICS_ADDR is
// unset, and each scrape reads PostgreSQL (the outbox backlog, on the
// request pool) and runs INFO on both Redis databases. A flood of scrapes
// must not turn into a flood of those reads: the readings are taken at
// most once a second and shared, so the cost to Redis and PostgreSQL stays
// the same whatever the scrape rate, and every scrape still gets them.
func TestMetricsFloodReadsTheDatabasesAtMostOnceASecond(t *testing.T) {
	r, vars := ownRedisEnv(t)
	m := start(t, vars)
	if fams := scrape(t, m); fams["han_redis_up"] == nil || fams["han_outbox_backlog"] == nil {
		t.Fatal("the first scrape has no han_redis_up or han_outbox_backlog")
	}

	before := infoCalls(t, r)
	began := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				resp, err := http.Get(m.URL() + "/metrics")
				ok := err == nil && resp.StatusCode == 200
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					ok = ok && strings.Contains(string(b), `han_redis_up{db="1"} 1`)
				}
				if !ok {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	calls := infoCalls(t, r) - before - 1 // the count's own INFO
	if failed > 0 {
		t.Errorf("%d of 300 scrapes failed or lacked the Redis readings", failed)
	}
	// Two databases, at most one reading a second, plus the one in flight
	// when the flood began and the one at its end.
	if most := 2 * (int(elapsed/time.Second) + 2); calls > most {
		t.Fatalf("300 scrapes in %v ran INFO %d times, want at most %d", elapsed.Round(time.Millisecond), calls, most)
	}
	t.Logf("300 scrapes in %v ran INFO %d times", elapsed.Round(time.Millisecond), calls)
}
