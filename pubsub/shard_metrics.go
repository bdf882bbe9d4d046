package pubsub

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	shardUpDesc = prometheus.NewDesc("han_pubsub_shard_link_up",
		"1 while this instance's sharded Pub/Sub connection to the master answers its PINGs (Redis Cluster only).",
		[]string{"shard"}, nil)
	shardChannelsDesc = prometheus.NewDesc("han_pubsub_shard_channels",
		"Channels this instance has assigned to the master's shard connection (Redis Cluster only).",
		[]string{"shard"}, nil)
)

// newShardMetrics makes the per-shard metrics and registers them on a
// cluster; on a standalone Redis they exist but are not exported.
func (s *Subscriber) newShardMetrics(reg prometheus.Registerer) error {
	s.shardReconnects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "han_pubsub_shard_reconnects_total",
		Help: "Sharded Pub/Sub connections lost after they were up, by master (Redis Cluster only)."}, []string{"shard"})
	s.shardLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "han_pubsub_shard_ping_seconds",
		Help: "Round trip of the last PING on the sharded Pub/Sub connection, by master (Redis Cluster only)."}, []string{"shard"})
	if reg == nil || s.cluster == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{s.shardReconnects, s.shardLag, shardCollector{s}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// shardCollector reports each current shard connection's state and
// channel count at scrape time, and as down (0, no channels) a master
// whose connection was lost while its channels wait for the new owner.
type shardCollector struct{ s *Subscriber }

func (c shardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- shardUpDesc
	ch <- shardChannelsDesc
}

func (c shardCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	type row struct {
		addr     string
		up       bool
		channels int
	}
	rows := make([]row, 0, len(s.shards))
	for addr, sh := range s.shards {
		rows = append(rows, row{addr, sh.up, sh.live})
	}
	for addr := range s.downShards {
		if s.shards[addr] == nil {
			rows = append(rows, row{addr: addr})
		}
	}
	s.mu.Unlock()
	for _, r := range rows {
		up := 0.0
		if r.up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(shardUpDesc, prometheus.GaugeValue, up, r.addr)
		ch <- prometheus.MustNewConstMetric(shardChannelsDesc, prometheus.GaugeValue, float64(r.channels), r.addr)
	}
}
