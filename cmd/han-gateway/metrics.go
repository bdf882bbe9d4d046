package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store"
)

// opsCollector reads, at scrape time, what no request path counts: the
// outbox backlog in PostgreSQL and each Redis database's reachability and
// INFO figures (clients and their output buffers — Pub/Sub subscribers
// included —, memory, evictions). PostgreSQL and each Redis database are
// read side by side, each within the timeout, so a stalled or slow
// PostgreSQL or DB0 does not use up another probe's time and read as that
// database down. A failed Redis probe
// reports up=0 and skips that database's INFO families; a backlog that
// could not be counted is left out, not guessed (han_postgres_up, from the
// readiness check, says whether PostgreSQL answers).
// Labels: db ("0" or "1") only. The readings are taken at most once every
// opsReadEvery and shared by the scrapes in between (a scrape during a
// reading waits for it): /metrics may be public (on HAN_HTTP_ADDR when
// HAN_METRICS_ADDR is unset), and a flood of scrapes must not become a
// flood of PostgreSQL queries on the request pool and Redis INFO calls.
type opsCollector struct {
	store   *store.Store
	dbs     [2]redis.UniversalClient
	timeout time.Duration

	mu       sync.Mutex // held during a reading
	readAt   time.Time  // when the last reading ended
	readings []prometheus.Metric

	outbox, up, clients, pubsubChannels, outBuf, usedMem, maxMem, evicted *prometheus.Desc
}

func newOpsCollector(st *store.Store, db0, db1 redis.UniversalClient, timeout time.Duration) *opsCollector {
	if timeout <= 0 || timeout > time.Second {
		timeout = time.Second
	}
	db := []string{"db"}
	return &opsCollector{store: st, dbs: [2]redis.UniversalClient{db0, db1}, timeout: timeout,
		outbox:         prometheus.NewDesc("han_outbox_backlog", "Outbox rows not yet delivered to Pub/Sub (PostgreSQL); absent when they could not be counted.", nil, nil),
		up:             prometheus.NewDesc("han_redis_up", "1 when the Redis database answered PING at scrape time (degraded state when 0).", db, nil),
		clients:        prometheus.NewDesc("han_redis_connected_clients", "INFO clients connected_clients of the Redis server behind the database.", db, nil),
		pubsubChannels: prometheus.NewDesc("han_redis_pubsub_channels", "INFO stats pubsub_channels: channels with at least one subscriber.", db, nil),
		outBuf:         prometheus.NewDesc("han_redis_client_recent_max_output_buffer_bytes", "INFO clients client_recent_max_output_buffer: the largest client output buffer (Pub/Sub subscribers included) of the last seconds.", db, nil),
		usedMem:        prometheus.NewDesc("han_redis_memory_used_bytes", "INFO memory used_memory.", db, nil),
		maxMem:         prometheus.NewDesc("han_redis_memory_max_bytes", "INFO memory maxmemory (0 = unlimited).", db, nil),
		evicted:        prometheus.NewDesc("han_redis_evicted_keys_total", "INFO stats evicted_keys since the Redis server started.", db, nil),
	}
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.outbox, c.up, c.clients, c.pubsubChannels, c.outBuf, c.usedMem, c.maxMem, c.evicted} {
		ch <- d
	}
}

// opsReadEvery is the shortest time between two readings of opsCollector.
const opsReadEvery = time.Second

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if c.readAt.IsZero() || time.Since(c.readAt) >= opsReadEvery {
		out := make(chan prometheus.Metric, 32)
		go func() {
			c.read(out)
			close(out)
		}()
		// A new slice: scrapes still sending the previous one keep it.
		var fresh []prometheus.Metric
		for m := range out {
			fresh = append(fresh, m)
		}
		c.readings, c.readAt = fresh, time.Now()
	}
	readings := c.readings
	c.mu.Unlock()
	for _, m := range readings {
		ch <- m
	}
}

// read takes the readings, PostgreSQL's and each Redis database's side by
// side, all within c.timeout: the probes share no time, so a slow one
// leaves the others theirs (one after the other, a DB0 that takes most of
// the timeout to answer leaves DB1 too little, and DB1 reads as down).
func (c *opsCollector) read(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if n, err := c.store.OutboxPending(ctx); err == nil {
			ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(n))
		}
	})
	for i, rdb := range c.dbs {
		if rdb != nil {
			wg.Go(func() { c.readRedis(ctx, rdb, strconv.Itoa(i), ch) })
		}
	}
	wg.Wait()
}

// readRedis reads one Redis database's reachability and INFO figures.
func (c *opsCollector) readRedis(ctx context.Context, rdb redis.UniversalClient, db string, ch chan<- prometheus.Metric) {
	info, err := rdb.Info(ctx, "clients", "memory", "stats").Result()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0, db)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1, db)
	f := infoFields(info)
	for _, m := range []struct {
		d     *prometheus.Desc
		field string
		t     prometheus.ValueType
	}{
		{c.clients, "connected_clients", prometheus.GaugeValue},
		{c.pubsubChannels, "pubsub_channels", prometheus.GaugeValue},
		{c.outBuf, "client_recent_max_output_buffer", prometheus.GaugeValue},
		{c.usedMem, "used_memory", prometheus.GaugeValue},
		{c.maxMem, "maxmemory", prometheus.GaugeValue},
		{c.evicted, "evicted_keys", prometheus.CounterValue},
	} {
		if v, ok := f[m.field]; ok {
			ch <- prometheus.MustNewConstMetric(m.d, m.t, v, db)
		}
	}
}

// infoFields parses the numeric fields of an INFO reply.
func infoFields(info string) map[string]float64 {
	out := map[string]float64{}
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
		}
	}
	return out
}

// newBuildInfo is han_build_info{version,commit,go_version} = 1, so
// dashboards and alerts can tell which build each instance runs (a rollout
// shows as two commits at once). version is the module version ("(devel)"
// for a build from a checkout), commit the VCS revision go build stamped
// ("-dirty" when the tree had changes; "unknown" when it stamped none, as
// under go test).
func newBuildInfo() prometheus.Collector {
	version, commit := "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && commit != "unknown" {
			commit += "-dirty"
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "han_build_info",
		Help:        "Always 1; the labels name the running build.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "go_version": runtime.Version()}})
	g.Set(1)
	return g
}
