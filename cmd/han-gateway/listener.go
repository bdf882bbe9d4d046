package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/connlimit"
	"github.com/han-app/gateway/store"
)

// descriptorReserve is kept free under the default connection cap for what
// is not a client connection or a pool: listeners, Pub/Sub connections,
// JWKS fetches, blob files (at most restapi.DefaultMaxOpenBlobs, half of
// it), logs.
const descriptorReserve = 256

// connCaps returns the process and per-peer connection caps: the
// configured values, else RLIMIT_NOFILE minus the Redis and PostgreSQL pool
// sizes, descriptorReserve and the refusals that linger
// (connlimit.MaxLingering), and a quarter of that per peer. A configured
// HAN_MAX_CONNECTIONS above that room is refused: client connections would
// use up the descriptors before the cap is reached, so accept would fail
// (clients left unanswered instead of refused with 503) and the pools could
// not dial.
func (m *Main) connCaps(ctx context.Context) (total, perIP int, err error) {
	total, perIP = m.Config.MaxConnections, m.Config.MaxConnsPerIP
	room, limit, pools, rerr := m.descriptorRoom(ctx)
	kept := descriptorReserve + connlimit.MaxLingering
	switch {
	case total == 0 && rerr != nil:
		return 0, 0, fmt.Errorf("HAN_MAX_CONNECTIONS: unset and the descriptor limit is unreadable: %w", rerr)
	case total == 0 && room < 1:
		return 0, 0, fmt.Errorf("HAN_MAX_CONNECTIONS: unset and the descriptor limit (%d) leaves no room after the pools (%d) and the reserve (%d)",
			limit, pools, kept)
	case total == 0:
		total = room
	case rerr == nil && total > room:
		return 0, 0, fmt.Errorf("HAN_MAX_CONNECTIONS: at most %d with the descriptor limit (%d) less the pools (%d) and the reserve (%d); "+
			"raise the limit (ulimit -n, LimitNOFILE=) or lower the cap", max(room, 0), limit, pools, kept)
	}
	if perIP == 0 {
		perIP = max(total/4, 1)
	}
	return total, perIP, nil
}

// descriptorRoom is how many client connections the descriptor limit
// (RLIMIT_NOFILE) leaves after the Redis and PostgreSQL pools,
// descriptorReserve and the lingering refusals, with the limit and the
// pools' size. A Redis Cluster client keeps a pool per node: its pool size
// counts once per node it knows now and per seed address the nodes do not
// announce.
func (m *Main) descriptorRoom(ctx context.Context) (room int, limit uint64, pools int, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, 0, err
	}
	pools = int(m.pg.Config().MaxConns)
	ctx, cancel := context.WithTimeout(ctx, m.Config.RedisTimeout)
	defer cancel()
	for _, c := range []redis.UniversalClient{m.rdb, m.rt, m.ops.stubDB2} {
		switch c := c.(type) {
		case *redis.ClusterClient:
			pools += m.clusterNodes(ctx, c) * c.Options().PoolSize
		case interface{ Options() *redis.Options }:
			pools += c.Options().PoolSize
		}
	}
	limit = min(lim.Cur, 1<<30)
	return int(limit) - pools - descriptorReserve - connlimit.MaxLingering, limit, pools, nil
}

// clusterNodes is how many connection pools c may keep: one per node it
// knows (masters and replicas) and one per seed address the nodes do not
// announce (go-redis keeps a pool for each until it drops unused ones).
// Nodes it cannot list now (the cluster unreachable at start-up) are not
// counted, which the log says.
func (m *Main) clusterNodes(ctx context.Context, c *redis.ClusterClient) int {
	var mu sync.Mutex
	addrs := map[string]bool{}
	for _, a := range c.Options().Addrs {
		addrs[a] = true
	}
	err := c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		addrs[n.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		m.Logger.Warn("connection caps: the Redis Cluster's nodes are unknown at start-up; its pools are counted once per seed address",
			slog.Int("seed_addresses", len(c.Options().Addrs)), slog.String("kind", store.Kind(err)))
	}
	return max(len(addrs), 1)
}

// handshakeConcurrency is how many WebSocket handshakes do their Redis and
// PostgreSQL work at once: HAN_WS_HANDSHAKE_CONCURRENCY, else twice the
// PostgreSQL pool plus the realtime Redis pool. A handshake holds at most
// one connection of one of them at a time, and presence registrations
// share pipelines, so this keeps both pools busy without leaving
// handshakes to time out in a pool's wait.
func (m *Main) handshakeConcurrency() int {
	if n := m.Config.WSHandshakeConcurrency; n > 0 {
		return n
	}
	pools := int(m.pg.Config().MaxConns)
	switch c := m.rt.(type) {
	case interface{ Options() *redis.Options }:
		pools += c.Options().PoolSize
	case interface{ Options() *redis.ClusterOptions }:
		pools += c.Options().PoolSize // per node
	}
	return 2 * pools
}

// capListener wraps ln with the connection caps; trusted proxies are
// exempt from the per-peer cap because one proxy carries many clients.
func (m *Main) capListener(ctx context.Context, ln net.Listener, reg prometheus.Registerer) (net.Listener, error) {
	total, perIP, err := m.connCaps(ctx)
	if err != nil {
		return nil, err
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "han_http_connections_refused_total",
		Help: "Client connections refused with 503 overloaded, by the cap that was reached (total, per_ip).",
	}, []string{"reason"})
	// Both series exist from the start, so dashboards and alerts see 0
	// rather than no data before the first refusal.
	refused.WithLabelValues("total")
	refused.WithLabelValues("per_ip")
	l := connlimit.New(ln, connlimit.Config{Max: total, PerIP: perIP, Unlimited: m.Config.TrustedProxies,
		OnRefuse: func(reason string) { refused.WithLabelValues(reason).Inc() }})
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "han_http_connections_open", Help: "Open client connections (HTTP and WebSocket) counted against HAN_MAX_CONNECTIONS.",
	}, func() float64 { return float64(l.Open()) })
	if err := reg.Register(refused); err != nil {
		return nil, err
	}
	if err := reg.Register(open); err != nil {
		return nil, err
	}
	m.Logger.Info("connection caps", slog.Int("max_connections", total), slog.Int("max_conns_per_ip", perIP),
		slog.Int("trusted_proxies", len(m.Config.TrustedProxies)))
	return l, nil
}
