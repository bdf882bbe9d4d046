package main

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// The cluster stack: `scripts/dev.sh --cluster` in the background brings up
// a 3-master + 3-replica Redis Cluster and two gateways on it; `--env`
// gives cluster URLs and both gateway URLs; han-loadtest spread over the
// two (its -target list from --env) gets every message sent through one
// gateway to the socket on the other; `--stop` stops the gateways and every
// node. Then `scripts/dev.sh --cluster --check` does its own round trip
// across the gateways and stops. It builds bin/ and starts PostgreSQL and
// six redis-server processes: skipped with -short.
func TestDevScriptClusterEnvCheckAndStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole dev stack on a Redis Cluster")
	}
	d := newDevStack(t)
	log := filepath.Join(d.data, "dev.log")
	if out, err := d.script("scripts/dev.sh --cluster </dev/null >" + log + " 2>&1 &").CombinedOutput(); err != nil {
		t.Fatalf("start: %v %s", err, out)
	}
	t.Cleanup(func() { _, _ = d.stop() })
	devLog := func() string { b, _ := os.ReadFile(log); return string(b) }
	deadline := time.Now().Add(8 * time.Minute)
	for {
		if fi, err := os.Stat(filepath.Join(d.data, "run", "stack.env")); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) || strings.Contains(devLog(), "error:") {
			t.Fatalf("the cluster stack did not come up:\n%s", devLog())
		}
		time.Sleep(500 * time.Millisecond)
	}

	out, err := d.script(`eval "$(scripts/dev.sh --env)" && printf '%s\n' "$REDIS_URL" "$REDIS_REALTIME_URL" "$HAN_BASE_URL" "$HAN_BASE_URL_2" "$HAN_BASE_URLS"`).Output()
	if err != nil {
		t.Fatalf("dev.sh --env: %v", err)
	}
	v := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(v) != 5 {
		t.Fatalf("dev.sh --env: %d values, want 5", len(v))
	}
	redisURL, base1, base2 := v[0], v[2], v[3]
	if v[1] != redisURL || !rds.IsClusterURL(redisURL) {
		t.Fatal("REDIS_URL and REDIS_REALTIME_URL are not the same cluster URL")
	}
	if base1 == "" || base2 == "" || base1 == base2 || v[4] != base1+","+base2 {
		t.Fatalf("gateway URLs %q %q, list %q", base1, base2, v[4])
	}
	nodes := clusterNodeAddrs(t, redisURL)
	checkClusterShape(t, redisURL)
	for _, b := range []string{base1, base2} {
		if code := httpStatus(t, b+"/readyz"); code != 200 {
			t.Fatalf("%s/readyz: %d", b, code)
		}
	}

	// han-loadtest over both gateways, as docs/loadtest.md shows it.
	lt, err := d.script(`eval "$(scripts/dev.sh --env)" && bin/han-loadtest run chat-fanout -target "$HAN_BASE_URLS" ` +
		`-users 4 -dialogs 1 -rate 4 -duration 1s -threshold delivery_lost==0 -threshold delivery_duplicates==0 -quiet`).CombinedOutput()
	if err != nil {
		t.Fatalf("han-loadtest over both gateways: %v\n%s", err, lt)
	}
	for _, b := range []string{base1, base2} {
		if !strings.Contains(string(lt), "ws_sessions{target="+b+"}") {
			t.Errorf("the summary lacks the sessions on %s:\n%s", b, lt)
		}
	}

	if out, err := d.stop(); err != nil || !strings.Contains(out, "stopped") {
		t.Fatalf("dev.sh --stop: %v %s", err, out)
	}
	for _, a := range append(nodes, strings.TrimPrefix(base1, "http://"), strings.TrimPrefix(base2, "http://")) {
		if c, err := net.DialTimeout("tcp", a, 2*time.Second); err == nil {
			c.Close()
			t.Errorf("%s still answers after --stop", a)
		}
	}
	left, _ := filepath.Glob(filepath.Join(d.data, "run", "*.pid"))
	if _, err := os.Stat(filepath.Join(d.data, "run", "stack.env")); err == nil || len(left) > 0 {
		t.Errorf("state left after --stop: stack.env or %v", left)
	}

	chk, err := d.script("scripts/dev.sh --cluster --check </dev/null").CombinedOutput()
	if err != nil || !strings.Contains(string(chk), "dev.sh --check: OK") || !strings.Contains(string(chk), "sockets: 1 on") {
		t.Fatalf("dev.sh --cluster --check: %v\n%s", err, chk)
	}
}

// clusterNodeAddrs lists the host and every addr= node of a cluster URL.
func clusterNodeAddrs(t *testing.T, raw string) []string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal("bad cluster URL")
	}
	addrs := append([]string{u.Host}, u.Query()["addr"]...)
	seen := map[string]bool{}
	for _, a := range addrs {
		if h, _, err := net.SplitHostPort(a); err != nil || h != "127.0.0.1" || seen[a] {
			t.Fatalf("cluster URL node %q: want distinct loopback nodes", a)
		}
		seen[a] = true
	}
	if len(addrs) != 6 || u.User.Username() != rds.APIBackendUser {
		t.Fatalf("cluster URL: %d nodes as %q, want 6 as %s", len(addrs), u.User.Username(), rds.APIBackendUser)
	}
	return addrs
}

// checkClusterShape connects as the gateways do and reads the slot map:
// three masters cover every slot, each with one replica.
func checkClusterShape(t *testing.T, raw string) {
	t.Helper()
	opt, err := rds.ParseClusterURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS as api_backend: %v", err)
	}
	covered := 0
	for _, s := range slots {
		covered += s.End - s.Start + 1
		if len(s.Nodes) != 2 {
			t.Errorf("slots %d-%d: %d nodes, want a master and a replica", s.Start, s.End, len(s.Nodes))
		}
	}
	if len(slots) != 3 || covered != 16384 {
		t.Errorf("%d slot ranges covering %d slots, want 3 covering 16384", len(slots), covered)
	}
}

// httpStatus is the status of a GET of u.
func httpStatus(t *testing.T, u string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
