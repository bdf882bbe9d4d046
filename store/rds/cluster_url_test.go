package rds_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// A URL with addr= seeds opens a cluster client, any other a standalone
// one; a cluster URL naming a database other than 0 is refused with an
// error that does not echo the URL (it holds the password).
func TestNewRedisPicksTheClientByURL(t *testing.T) {
	cases := []struct {
		url     string
		cluster bool
		err     error
	}{
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379/1"},
		{url: "rediss://api_backend:pw-secret@10.0.0.1:6380/0"},
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379?addr=10.0.0.2:6379&addr=10.0.0.3:6379", cluster: true},
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379/?addr=10.0.0.2:6379", cluster: true},
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379/0?addr=10.0.0.2:6379", cluster: true},
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379/1?addr=10.0.0.2:6379", err: rds.ErrClusterDB},
		{url: "redis://api_backend:pw-secret@10.0.0.1:6379/0?addr=10.0.0.2:6379&bogus=1", err: errors.New("invalid")},
		{url: "http://api_backend:pw-secret@10.0.0.1:6379?addr=10.0.0.2:6379", err: errors.New("invalid")},
	}
	for _, c := range cases {
		if got := rds.IsClusterURL(c.url); got != (c.cluster || c.err != nil && strings.Contains(c.url, "addr=")) {
			t.Errorf("IsClusterURL(%q) = %v", c.url, got)
		}
		cl, err := rds.NewRedis(c.url, rds.RedisConfig{})
		if c.err != nil {
			if err == nil {
				cl.Close()
				t.Errorf("NewRedis(%q) must fail", c.url)
				continue
			}
			if errors.Is(c.err, rds.ErrClusterDB) && !errors.Is(err, rds.ErrClusterDB) {
				t.Errorf("NewRedis(%q) = %v, want ErrClusterDB", c.url, err)
			}
			if strings.Contains(err.Error(), "pw-secret") || strings.Contains(err.Error(), "10.0.0") {
				t.Errorf("error echoes the URL: %v", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("NewRedis(%q): %v", c.url, err)
			continue
		}
		_, isCluster := cl.(*redis.ClusterClient)
		if isCluster != c.cluster {
			t.Errorf("NewRedis(%q) cluster client = %v, want %v", c.url, isCluster, c.cluster)
		}
		cl.Close()
	}
}

// The cluster client gets the service's timeouts and pool settings, not
// go-redis's defaults.
func TestClusterClientGetsTheServiceDefaults(t *testing.T) {
	opt, err := rds.ParseClusterURL("redis://api_backend:pw@10.0.0.1:6379?addr=10.0.0.2:6379&addr=10.0.0.3:6379")
	if err != nil {
		t.Fatal(err)
	}
	if len(opt.Addrs) != 3 || opt.Username != rds.APIBackendUser || opt.Password != "pw" {
		t.Fatalf("seeds or credentials lost: %d seeds, user %q", len(opt.Addrs), opt.Username)
	}
	cl, err := rds.NewRedis("redis://api_backend:pw@10.0.0.1:6379?addr=10.0.0.2:6379", rds.RedisConfig{ReadTimeout: 1234e6, ClientName: "han-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := cl.(*redis.ClusterClient).Options()
	if got.ReadTimeout != 1234e6 || got.DialTimeout != 1e9 || got.PoolTimeout != 1e9 || got.MaxRetries != 1 ||
		!got.ContextTimeoutEnabled || got.ClientName != "han-test" || got.MinIdleConns != 2 {
		t.Fatalf("cluster options: read %v dial %v pool %v retries %d ctx %v name %q idle %d", got.ReadTimeout, got.DialTimeout,
			got.PoolTimeout, got.MaxRetries, got.ContextTimeoutEnabled, got.ClientName, got.MinIdleConns)
	}
}

// The cluster ACL lets api_backend read the slot map, denies SELECT, and
// the standalone ACL grants neither cluster subcommand.
func TestRenderACLForCluster(t *testing.T) {
	cl := rds.RenderACL(rds.ACLOptions{APIBackendPassword: "p", Cluster: true})
	single := rds.RenderACL(rds.ACLOptions{APIBackendPassword: "p"})
	for _, c := range rds.ClusterCommands {
		if !strings.Contains(cl, " +"+c) {
			t.Errorf("cluster ACL lacks +%s:\n%s", c, cl)
		}
		if strings.Contains(single, c) {
			t.Errorf("standalone ACL grants %s:\n%s", c, single)
		}
	}
	if !strings.Contains(cl, " -select") {
		t.Errorf("cluster ACL must deny SELECT:\n%s", cl)
	}
}
