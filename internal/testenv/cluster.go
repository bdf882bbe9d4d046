package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// ClusterOptions configures a private Redis Cluster.
type ClusterOptions struct {
	Masters int // zero value means 3
	// Replicas is the number of replicas of each master. Zero value means
	// 1; a negative value means none.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a node may stay silent
	// before the others fail it over. Zero value means 1s, so a failover
	// takes seconds.
	NodeTimeout time.Duration
}

// RedisCluster is a private Redis Cluster of redis-server processes on
// loopback, every node loaded with the cluster ACL (rds.ACLOptions.Cluster).
// It is created through the admin user; the code under test connects as
// api_backend with URL. Node methods are safe for concurrent use.
type RedisCluster struct {
	Opts     ClusterOptions
	Nodes    []*RedisServer // masters first (in slot order), then their replicas
	Password string         // api_backend's password
	AdminPwd string
}

// StartCluster starts Masters+Masters*Replicas nodes, splits the 16384 slots
// evenly over the masters, attaches the replicas (replica i follows master
// i mod Masters) and waits until every node reports the cluster healthy
// and every replica is in sync.
func StartCluster(opts ClusterOptions) (*RedisCluster, error) {
	if opts.Masters <= 0 {
		opts.Masters = 3
	}
	switch {
	case opts.Replicas == 0:
		opts.Replicas = 1
	case opts.Replicas < 0:
		opts.Replicas = 0
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = time.Second
	}
	c := &RedisCluster{Opts: opts, Password: "api-" + randHex(12), AdminPwd: "admin-" + randHex(12)}
	n := opts.Masters * (1 + opts.Replicas)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	c.Nodes = make([]*RedisServer, n)
	for i := range n {
		wg.Go(func() {
			s, err := StartRedis(RedisOptions{Cluster: true, ClusterNodeTimeout: opts.NodeTimeout,
				Password: c.Password, AdminPassword: c.AdminPwd})
			mu.Lock()
			defer mu.Unlock()
			c.Nodes[i] = s
			if err != nil && first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	if first != nil {
		c.Stop()
		return nil, first
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.create(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("testenv: create cluster: %w", err)
	}
	return c, nil
}

func (c *RedisCluster) create(ctx context.Context) error {
	m := c.Opts.Masters
	ids := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a := s.AdminClient(0)
		id, err := a.Do(ctx, "cluster", "myid").Text()
		if err == nil && i < m {
			err = a.Do(ctx, "cluster", "addslotsrange", i*16384/m, (i+1)*16384/m-1).Err()
		}
		a.Close()
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		ids[i] = id
	}
	// A replica can follow its master only once it knows the master. A
	// handshake that does not finish within the node timeout (a loaded
	// machine) is forgotten by Redis, so the meetings are asked for again
	// every second until every node knows every other.
	met := func(ctx context.Context, a *redis.Client) bool {
		nodes, err := a.ClusterNodes(ctx).Result()
		return err == nil && strings.Count(nodes, "\n") == len(c.Nodes) && !strings.Contains(nodes, "handshake")
	}
	for {
		if err := c.meet(ctx); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.waitAll(wctx, met)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return errors.New("nodes did not meet")
		}
	}
	for i := m; i < len(c.Nodes); i++ {
		a := c.Nodes[i].AdminClient(0)
		err := a.ClusterReplicate(ctx, ids[i%m]).Err()
		a.Close()
		if err != nil {
			return fmt.Errorf("replicate node %d: %w", i, err)
		}
	}
	return c.WaitHealthy(ctx)
}

// meet asks every node but the first to meet the first (the bus port is
// not port+10000 here: it is named). Asking again is harmless: a node
// already known is recognised once its handshake answers.
func (c *RedisCluster) meet(ctx context.Context) error {
	for i, s := range c.Nodes[1:] {
		a := s.AdminClient(0)
		err := a.Do(ctx, "cluster", "meet", "127.0.0.1", c.Nodes[0].Port, c.Nodes[0].BusPort).Err()
		a.Close()
		if err != nil {
			return fmt.Errorf("node %d: %w", i+1, err)
		}
	}
	return nil
}

// WaitHealthy waits until every running node reports cluster_state:ok,
// sees every slot served by a master (one CLUSTER SLOTS range per master)
// and every running node in the slot map, and, if it is a replica, has its
// link to the master up.
func (c *RedisCluster) WaitHealthy(ctx context.Context) error {
	running := 0
	for _, s := range c.Nodes {
		if s.Running() {
			running++
		}
	}
	return c.waitAll(ctx, func(ctx context.Context, a *redis.Client) bool {
		info, err := a.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		slots, err := a.ClusterSlots(ctx).Result()
		if err != nil || len(slots) != c.Opts.Masters {
			return false
		}
		listed := 0
		for _, r := range slots {
			listed += len(r.Nodes)
		}
		if listed != running {
			return false
		}
		repl, err := a.Info(ctx, "replication").Result()
		return err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
	})
}

// waitAll polls cond on every running node until it holds on all of them.
func (c *RedisCluster) waitAll(ctx context.Context, cond func(context.Context, *redis.Client) bool) error {
	for {
		ok := true
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			a := s.AdminClient(0)
			ok = cond(ctx, a)
			a.Close()
			if !ok {
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL is api_backend's cluster URL (the form REDIS_URL takes on a cluster):
// the first node as host, every other node as an addr= seed.
func (c *RedisCluster) URL() string {
	q := url.Values{}
	for _, s := range c.Nodes[1:] {
		q.Add("addr", s.Addr())
	}
	return fmt.Sprintf("redis://%s:%s@%s?%s", rds.APIBackendUser, c.Password, c.Nodes[0].Addr(), q.Encode())
}

// AdminClient returns an unrestricted cluster client; the caller closes it.
func (c *RedisCluster) AdminClient() *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: AdminUser, Password: c.AdminPwd,
		DialTimeout: time.Second, ReadTimeout: 5 * time.Second, MaxRedirects: 8})
}

// MasterOf returns the node that serves key's slot as master, asked of
// the first running node.
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (*RedisServer, error) {
	slot := Slot(key)
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		a := s.AdminClient(0)
		ranges, err := a.ClusterSlots(ctx).Result()
		a.Close()
		if err != nil {
			return nil, err
		}
		for _, r := range ranges {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
				return c.node(r.Nodes[0].Addr)
			}
		}
		return nil, fmt.Errorf("slot %d has no master", slot)
	}
	return nil, errors.New("no node running")
}

func (c *RedisCluster) node(addr string) (*RedisServer, error) {
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s, nil
		}
	}
	return nil, fmt.Errorf("unknown node %s", addr)
}

// Masters returns the running nodes that are masters now.
func (c *RedisCluster) Masters(ctx context.Context) ([]*RedisServer, error) {
	var out []*RedisServer
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		a := s.AdminClient(0)
		role, err := a.Do(ctx, "role").Slice()
		a.Close()
		if err != nil {
			return nil, err
		}
		if len(role) > 0 && role[0] == "master" {
			out = append(out, s)
		}
	}
	return out, nil
}

// FlushAll empties every master (its replicas follow), between tests.
func (c *RedisCluster) FlushAll(ctx context.Context) error {
	masters, err := c.Masters(ctx)
	if err != nil {
		return err
	}
	for _, s := range masters {
		a := s.AdminClient(0)
		err := a.FlushAll(ctx).Err()
		a.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Stop kills every node and removes their directories.
func (c *RedisCluster) Stop() {
	if c == nil {
		return
	}
	var wg sync.WaitGroup
	for _, s := range c.Nodes {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// Slot is the Redis Cluster hash slot of key (rds.Slot, which the
// service uses to group shard channels by slot).
func Slot(key string) int { return rds.Slot(key) }
