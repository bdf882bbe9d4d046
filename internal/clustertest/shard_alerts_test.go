package clustertest_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var shardFamily = regexp.MustCompile(`\bhan_pubsub_shard_[a-z_]*[a-z]`)

// assertShardFamiliesExported fails unless reg, a subscriber's registry on
// a cluster, exports every per-shard family the deploy/ alert rules and
// dashboard read (the gateway's own deploy test scrapes a standalone Redis,
// where these families do not exist).
func assertShardFamiliesExported(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	used := 0
	for _, f := range []string{"../../deploy/prometheus-alerts.yml", "../../deploy/grafana-dashboard.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range shardFamily.FindAllString(string(b), -1) {
			used++
			if !exported[name] {
				t.Errorf("%s reads %s, which a subscriber on a cluster does not export", f, name)
			}
		}
	}
	if used == 0 {
		t.Error("no per-shard Pub/Sub family is read by the alerts or the dashboard")
	}
}
