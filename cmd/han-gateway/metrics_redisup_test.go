package main

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/testenv"
)

// Each Redis database's reachability is its own: while DB0 answers nothing
// (a partition: no error, no reply) and reads as down, DB1, which answers,
// reads as up with its INFO figures, in the same scrape. DB0's probe takes
// the whole timeout; DB1's must not be left with what remains of it.
func TestAStalledDB0DoesNotReadAsDB1Down(t *testing.T) {
	p, proxied := faultproxy.ForURL(t, env.Redis.URL(0))
	vars := baseEnv()
	vars["REDIS_URL"] = proxied
	m := start(t, vars)
	const limit = 5 * time.Second // the probes' timeout is at most 1 s
	up := func(fams map[string]*dto.MetricFamily, db string) float64 {
		return counterValue(fams["han_redis_up"], map[string]string{"db": db})
	}
	if fams := scrapeWithin(t, m, limit); up(fams, "0") != 1 || up(fams, "1") != 1 {
		t.Fatalf("both databases answering: han_redis_up db0=%v db1=%v", up(fams, "0"), up(fams, "1"))
	}

	p.Blackhole(true)
	t.Cleanup(func() {
		p.Blackhole(false)
		p.Cut()
	})
	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 15*time.Second, func() bool {
		fams = scrapeWithin(t, m, limit)
		return up(fams, "0") == 0
	}, "han_redis_up{db=\"0\"} not 0 while DB0 answers nothing")
	if v := up(fams, "1"); v != 1 {
		t.Fatalf("han_redis_up{db=\"1\"} = %v while only DB0 is out", v)
	}
	if fams["han_redis_connected_clients"] == nil || counterValue(fams["han_redis_connected_clients"], map[string]string{"db": "1"}) < 1 {
		t.Fatalf("DB1's INFO figures missing while only DB0 is out: %v", fams["han_redis_connected_clients"])
	}
}
