package clustertest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

// The harness's cluster has 3 masters with one replica each, covers every
// slot, and api_backend reaches every master through the cluster URL.
func TestClusterServesEverySlotAsAPIBackend(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("a cluster URL must open a cluster client, got %T", rdb)
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("api_backend must read the slot map: %v", err)
	}
	covered := 0
	for _, r := range slots {
		covered += int(r.End - r.Start + 1)
		if len(r.Nodes) != 2 {
			t.Errorf("slots %d-%d: %d nodes, want master + replica", r.Start, r.End, len(r.Nodes))
		}
	}
	if len(slots) != 3 || covered != 16384 {
		t.Fatalf("%d slot ranges covering %d slots, want 3 covering 16384", len(slots), covered)
	}
	masters := map[string]bool{}
	for i := range 64 {
		key := fmt.Sprintf("han:api:probe:{%d}", i)
		if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET as api_backend: %v", err)
		}
		m, err := env.Cluster.MasterOf(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Addr()] = true
	}
	if len(masters) != 3 {
		t.Fatalf("64 keys landed on %d masters, want 3", len(masters))
	}
	// The cluster ACL is still api_backend's: no other key family, no
	// other cluster subcommand.
	if err := rdb.Set(ctx, "other:{x}", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("a key outside the service's prefixes must be NOPERM, got %v", err)
	}
	if err := cc.ClusterNodes(ctx).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("CLUSTER NODES must stay denied, got %v", err)
	}
}

// The cluster subcommands the ACL grants exist in the Redis in use (an
// unknown subcommand in an ACL file stops redis-server loading it, and a
// renamed one would leave the client without its slot map).
func TestClusterACLCommandsExist(t *testing.T) {
	ctx := context.Background()
	admin := env.Cluster.Nodes[0].AdminClient(0)
	defer admin.Close()
	for _, c := range rds.ClusterCommands {
		info, err := admin.Do(ctx, "command", "info", c).Slice()
		if err != nil || len(info) != 1 || info[0] == nil {
			t.Errorf("COMMAND INFO %s: %v %v", c, info, err)
		}
	}
}

// testenv.Slot, which the tests use to place keys, agrees with the
// server's CLUSTER KEYSLOT, hash tags included.
func TestSlotMatchesKeyslot(t *testing.T) {
	ctx := context.Background()
	admin := env.Cluster.Nodes[0].AdminClient(0)
	defer admin.Close()
	for _, key := range []string{"a", "han:rt:instances", "han:prj:{dev:p1}:meta", "x{}y", "{}{a}", "x{a}{b}", "{user1000}.following", "k{", "ž{ü}"} {
		want, err := admin.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := testenv.Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, server says %d", key, got, want)
		}
	}
}
