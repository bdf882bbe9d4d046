// Command withcluster starts one private Redis Cluster (testenv.StartCluster:
// -masters masters, -replicas replicas each, every node loaded with the
// cluster ACL and the cluster created through the admin user), runs the
// given command with the cluster in its environment, stops the cluster and
// exits with the command's status (scripts/bench-cluster.sh):
//
//	HAN_TEST_CLUSTER_URL       api_backend's cluster URL (with addr= parameters), as REDIS_REALTIME_URL takes it
//	HAN_TEST_CLUSTER_PIDS      the redis-server process ids, space separated, masters first
//	HAN_TEST_CLUSTER_ADDRS     their addresses in the same order
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/han-app/gateway/internal/testenv"
)

func main() {
	fs := flag.NewFlagSet("withcluster", flag.ExitOnError)
	masters := fs.Int("masters", 3, "masters")
	replicas := fs.Int("replicas", 1, "replicas of each master (0: none)")
	_ = fs.Parse(os.Args[1:])
	args := fs.Args()
	if len(args) == 0 || *masters < 1 || *replicas < 0 {
		fmt.Fprintln(os.Stderr, "usage: withcluster [-masters N] [-replicas N] -- command [args...]")
		os.Exit(2)
	}
	c, err := start(*masters, *replicas)
	if err != nil {
		fmt.Fprintln(os.Stderr, "withcluster:", err)
		os.Exit(2)
	}
	pids := make([]string, len(c.Nodes))
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		pids[i], addrs[i] = strconv.Itoa(n.Pid()), n.Addr()
	}
	fmt.Fprintf(os.Stderr, "withcluster: private Redis Cluster, %d masters × %d replicas: %s\n", *masters, *replicas, strings.Join(addrs, " "))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "HAN_TEST_CLUSTER_URL="+c.URL(),
		"HAN_TEST_CLUSTER_PIDS="+strings.Join(pids, " "), "HAN_TEST_CLUSTER_ADDRS="+strings.Join(addrs, " "))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	code := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "withcluster:", err)
		code = 2
	} else {
		go func() {
			for s := range sig {
				_ = cmd.Process.Signal(s)
			}
		}()
		if err := cmd.Wait(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() > 0 {
				code = ee.ExitCode()
			} else {
				code = 1
			}
		}
	}
	c.Stop()
	os.Exit(code)
}

// start starts the cluster; replicas 0 is the harness's negative value
// (its zero value means one replica).
func start(masters, replicas int) (*testenv.RedisCluster, error) {
	if replicas == 0 {
		replicas = -1
	}
	return testenv.StartCluster(testenv.ClusterOptions{Masters: masters, Replicas: replicas})
}
