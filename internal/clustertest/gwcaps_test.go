package clustertest_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// On a Redis Cluster each client keeps a connection pool per node, so the
// descriptors the connection cap leaves to Redis grow with the nodes: a
// HAN_MAX_CONNECTIONS that leaves room for one pool per client, as on a
// standalone Redis, but not for one per node is refused at start-up, naming
// the variable and the largest value that fits. Accepted, client
// connections would use up the descriptors the pools need to reach the
// cluster's nodes.
func TestConnectionCapCountsAPoolPerClusterNode(t *testing.T) {
	bin, err := gwBuild()
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// The PostgreSQL pool (20), the reserve (256) and the lingering
	// refusals (64) kept, and 100 descriptors for Redis: more than the two
	// clients' pools on a standalone Redis with up to 5 CPUs (10 per CPU
	// each), fewer than two clients × 6 nodes × at least 10.
	if nodes := len(env.Cluster.Nodes); nodes < 6 {
		t.Fatalf("the cluster has %d nodes; the test counts on 6", nodes)
	}
	limit := min(lim.Cur, 1<<30)
	capv := int(limit) - 20 - 256 - 64 - 100
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(),
		"HAN_HTTP_ADDR=127.0.0.1:0", "HAN_INSTANCE_ID=clgw-caps",
		"REDIS_URL="+env.Cluster.URL(), "REDIS_REALTIME_URL="+env.Cluster.URL(), "DATABASE_URL="+env.DatabaseURL,
		"HAN_JWT_DEV_HS256_SECRET="+gwDevSecret, "HAN_HMAC_SECRET=clustertest-hmac-caps-0123456789",
		"HAN_BLOB_DIR="+t.TempDir(), "HAN_MAX_CONNECTIONS="+strconv.Itoa(capv))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("started with HAN_MAX_CONNECTIONS=%d, which leaves 100 descriptors for 6 nodes' pools", capv)
	}
	if err == nil {
		t.Fatal("exited 0 without serving")
	}
	if msg := string(out); !strings.Contains(msg, "HAN_MAX_CONNECTIONS: at most") {
		t.Fatalf("start-up error must name HAN_MAX_CONNECTIONS and the largest value that fits:\n%s", msg)
	}
}
