package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

func TestSizingFormula(t *testing.T) {
	in := sizingInputs{Identities: 1000, Routes: 5, Windows: 2, RateKeyBytes: 100, MutationsPerDay: 10000,
		IdemRecordBytes: 300, Connections: 2000, ConnBytes: 500, PubSubBuffers: 1 << 20, Fragmentation: 1.5, Growth: 1.3}
	r := in.estimate()
	if r.Rate != 1_000_000 || r.Idem != 3_000_000 || r.Realtime != 1_000_000+1<<20 {
		t.Fatalf("terms: %+v", r)
	}
	if want := (r.Rate + r.Idem + r.Realtime) * 1.5 * 1.3; r.Total != want {
		t.Fatalf("total %v, want %v", r.Total, want)
	}
	out, err := run(t, nil, "sizing", "--identities", "1000", "--routes", "5", "--windows", "2", "--rate-key-bytes", "100")
	if err != nil || !strings.Contains(out, "maxmemory") || !strings.Contains(out, "976.6 KiB") {
		t.Fatalf("sizing output: %v\n%s", err, out)
	}
	if _, err := run(t, nil, "sizing", "--growth", "0.5"); err == nil {
		t.Fatal("a growth factor below 1 must be refused")
	}
}

// NaN passes a "< 1" check and nothing bounds a product: inputs that are
// not finite numbers, or finite ones whose estimate overflows, are refused
// instead of printing "NaN B" or "+Inf TiB" as the maxmemory to set.
func TestSizingRefusesNonFiniteInputs(t *testing.T) {
	for _, a := range [][]string{{"--fragmentation", "NaN"}, {"--growth", "+Inf"}, {"--routes", "NaN"},
		{"--identities", "1e308", "--routes", "1e308"}} {
		out, err := run(t, nil, append([]string{"sizing"}, a...)...)
		if err == nil || strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
			t.Errorf("sizing %v: %v; it printed:\n%s", a, err, out)
		}
	}
}

func TestSizingSamplesALiveInstance(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	ctx := context.Background()
	c0, _ := rds.NewRedis(r.URL(0), rds.RedisConfig{})
	c1, _ := rds.NewRedis(r.URL(1), rds.RedisConfig{})
	defer c0.Close()
	defer c1.Close()
	for i := 0; i < 50; i++ {
		c0.Set(ctx, fmt.Sprintf("han:api:rl:user:u%d:r:1", i), 1, time.Minute)
		c0.HSet(ctx, fmt.Sprintf("han:api:idem:{s:u:%d}", i), "state", "completed", "fingerprint", strings.Repeat("f", 64), "status", 201)
		c0.Expire(ctx, fmt.Sprintf("han:api:idem:{s:u:%d}", i), time.Minute)
		c1.HSet(ctx, fmt.Sprintf("han:rt:conn:{u%d}:c", i), "user_id", "u", "instance", "i", "last_seen", 1)
		c1.Expire(ctx, fmt.Sprintf("han:rt:conn:{u%d}:c", i), time.Minute)
		// A closed connection's marker is no connection: not sampled.
		c1.Set(ctx, fmt.Sprintf("han:rt:conn:{u%d}:d:closed", i), 1, time.Minute)
	}
	out, err := run(t, map[string]string{"REDIS_URL": r.URL(0), "REDIS_REALTIME_URL": r.URL(1)}, "sizing", "--sample", "--sample-keys", "20")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sampled han:api:rl:*: 20 keys", "sampled han:api:idem:*: 20 keys", "sampled han:rt:conn:*: 20 keys"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The measured bytes replace the defaults in the formula lines.
	var n, avg int
	i := strings.Index(out, "sampled han:api:rl:*")
	if _, err := fmt.Sscanf(out[i:], "sampled han:api:rl:*: %d keys, %d bytes/key", &n, &avg); err != nil || avg <= 0 {
		t.Fatalf("cannot read the sampled rate bytes: %v", err)
	}
	if !strings.Contains(out, fmt.Sprintf("× 2 windows × %d B", avg)) {
		t.Errorf("the rate term should use the sampled %d B/key:\n%s", avg, out)
	}
	// The connections' average is of their HASHes alone.
	i = strings.Index(out, "sampled han:rt:conn:*")
	lo, hi := int64(math.MaxInt64), int64(0)
	for i := 0; i < 50; i++ {
		b := c1.MemoryUsage(ctx, fmt.Sprintf("han:rt:conn:{u%d}:c", i)).Val()
		lo, hi = min(lo, b), max(hi, b)
	}
	if _, err := fmt.Sscanf(out[i:], "sampled han:rt:conn:*: %d keys, %d bytes/key", &n, &avg); err != nil || int64(avg) < lo || int64(avg) > hi {
		t.Errorf("sampled connection bytes %d (%v), want a HASH's (%d to %d): the closed markers were counted", avg, err, lo, hi)
	}
}
