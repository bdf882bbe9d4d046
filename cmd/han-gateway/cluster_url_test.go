package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// A cluster URL (addr= seeds) naming a database other than 0 stops the
// start-up with an error that names the variable and the rule, never the
// URL's password or hosts.
func TestClusterURLMustUseDatabaseZero(t *testing.T) {
	for _, name := range []string{"REDIS_URL", "REDIS_REALTIME_URL"} {
		vars := baseEnv()
		vars[name] = "redis://api_backend:TOPSECRET@10.9.8.7:6379/1?addr=10.9.8.6:6379&addr=10.9.8.5:6379"
		m := NewMain()
		if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
			t.Fatalf("%s: a cluster URL must pass the configuration check: %v", name, err)
		}
		m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
		err := m.Run(context.Background())
		_ = m.Close()
		if err == nil {
			t.Fatalf("%s: a cluster URL on database 1 was accepted", name)
		}
		msg := err.Error()
		if !strings.Contains(msg, name+":") || !strings.Contains(msg, "database 0") ||
			strings.Contains(msg, "TOPSECRET") || strings.Contains(msg, "10.9.8") {
			t.Fatalf("%s: start-up error %q must name the variable and the rule, and echo nothing of the URL", name, msg)
		}
	}
}

// HAN_PUBSUB_MODE=sharded on a standalone realtime Redis stops the
// start-up with an error that names the variable and says why, before any
// instance could publish where no other instance listens.
func TestShardedPubSubModeNeedsCluster(t *testing.T) {
	vars := baseEnv()
	vars["HAN_PUBSUB_MODE"] = "sharded"
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatalf("sharded is a valid mode name: %v", err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	err := m.Run(context.Background())
	_ = m.Close()
	if err == nil {
		t.Fatal("sharded Pub/Sub on a standalone Redis was accepted")
	}
	if msg := err.Error(); !strings.Contains(msg, "HAN_PUBSUB_MODE=sharded:") || !strings.Contains(msg, "needs a Redis Cluster") {
		t.Fatalf("start-up error %q must name the variable and the rule", msg)
	}
	// Classic, like auto, runs on a standalone Redis.
	vars["HAN_PUBSUB_MODE"] = "classic"
	start(t, vars)
}
