package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// A second instance started with the HAN_INSTANCE_ID of one that is
// running (two deployments given the same id, a new process started before
// the old one stopped) is refused at start-up, naming the variable, and the
// running instance's users stay online. It used to start: clearing "its
// previous life" at start-up removed the running instance's connections
// from presence (their users went offline while connected), and the two
// shared one liveness marker and index from then on.
func TestSecondInstanceWithTheSameIDIsRefused(t *testing.T) {
	vars := baseEnv()
	vars["HAN_INSTANCE_ID"] = "dup-" + ids.New()[:8]
	vars["HAN_INSTANCE_LIVENESS_TTL"] = "3s"
	first := start(t, vars)
	a, b := ids.New(), ids.New()
	aTok, bTok := userToken(t, a), userToken(t, b)
	restDialog(t, first, aTok, b)
	connectRT(t, first, bTok)
	connections := func() int {
		t.Helper()
		code, body := call(t, "GET", first.URL()+"/v1/users/"+b+"/presence", aTok, "")
		var p struct{ Connections int }
		if code != 200 || json.Unmarshal([]byte(body), &p) != nil {
			t.Fatalf("presence: %d %s", code, body)
		}
		return p.Connections
	}
	if n := connections(); n != 1 {
		t.Fatalf("b's connections before the second start: %d, want 1", n)
	}

	second := NewMain()
	if err := second.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	second.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	began := time.Now()
	err := second.Run(context.Background())
	t.Cleanup(func() { _ = second.Close() })
	if n := connections(); n != 1 {
		t.Errorf("b's connections on the running instance after the second start: %d, want 1", n)
	}
	if err == nil || !strings.Contains(err.Error(), "HAN_INSTANCE_ID") {
		t.Fatalf("second instance with the same HAN_INSTANCE_ID: Run error %v, want a refusal naming HAN_INSTANCE_ID", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("the refusal took %v, want it within the liveness interval and the Redis timeout", d)
	}
}

// The same id after a crash (a marker its previous life left, no longer
// refreshed) or after a clean stop (no marker) starts, without waiting out
// the marker's TTL.
func TestInstanceRestartedAfterACrashStarts(t *testing.T) {
	vars := baseEnv()
	vars["HAN_INSTANCE_ID"] = "crashed-" + ids.New()[:8]
	vars["HAN_INSTANCE_LIVENESS_TTL"] = "30s"
	rdb := env.Redis.AdminClient(1)
	defer rdb.Close()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Last refreshed 13 s ago, more than the longest gap between two
	// refreshes (a liveness interval of 10 s + 10% jitter) plus the Redis
	// timeout: no instance refreshes it any more.
	last := strconv.FormatInt(now.Add(-13*time.Second).UnixMilli(), 10)
	if err := rdb.Set(ctx, presence.InstanceKey(vars["HAN_INSTANCE_ID"]), last, 17*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	start(t, vars)
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("restart after a crash took %v", d)
	}
}

// Two instances given the same HAN_INSTANCE_ID and started at the same
// moment: both used to find no liveness marker and both started. The marker
// is now claimed (set only if absent), so exactly one starts; the other
// finds the claim and is refused once the first refreshes its marker, as
// the first does as soon as it runs (played here by the test).
func TestInstancesStartingAtOnceWithTheSameIDStartOne(t *testing.T) {
	for round := 0; round < 3; round++ {
		vars := baseEnv()
		vars["HAN_INSTANCE_ID"] = "twin-" + ids.New()[24:] // the random end: rounds start within one ms
		vars["HAN_INSTANCE_LIVENESS_TTL"] = "3s"
		ctx := context.Background()
		twins := make([]*Main, 2)
		for i := range twins {
			m := NewMain()
			if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
				t.Fatal(err)
			}
			m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
			opt, err := redis.ParseURL(vars["REDIS_REALTIME_URL"])
			if err != nil {
				t.Fatal(err)
			}
			m.rt = redis.NewClient(opt)
			t.Cleanup(func() { _ = m.rt.Close() })
			twins[i] = m
		}
		results := make(chan error, 2)
		release := make(chan struct{})
		for _, m := range twins {
			go func() {
				<-release
				results <- m.checkInstanceID(ctx)
			}()
		}
		close(release)
		first := <-results
		if first != nil {
			t.Fatalf("round %d: the first answer is a refusal (%v): one of the two must start at once", round, first)
		}
		// The instance that started refreshes its marker as it runs (every
		// third of the liveness TTL).
		admin := env.Redis.AdminClient(1)
		done := make(chan struct{})
		refreshed := make(chan struct{})
		go func() {
			defer close(refreshed)
			for {
				_ = admin.Set(ctx, presence.InstanceKey(vars["HAN_INSTANCE_ID"]), strconv.FormatInt(time.Now().UnixMilli(), 10), 3*time.Second).Err()
				select {
				case <-done:
					return
				case <-time.After(time.Second):
				}
			}
		}()
		stop := func() { close(done); <-refreshed; admin.Close() }
		select {
		case second := <-results:
			stop()
			if second == nil || !strings.Contains(second.Error(), "HAN_INSTANCE_ID") {
				t.Fatalf("round %d: the second instance with the same id: %v, want a refusal naming HAN_INSTANCE_ID", round, second)
			}
		case <-time.After(5 * time.Second):
			stop()
			t.Fatalf("round %d: the second instance's check did not end", round)
		}
	}
}

// An idle running instance (no sockets) refreshes its liveness marker only
// from its liveness loop, a third of HAN_INSTANCE_LIVENESS_TTL apart plus
// up to 10% jitter, plus the refresh's round trip. A second instance with
// its id is refused every time, also when its TTL makes that jitter larger
// than HAN_REDIS_TIMEOUT: the check used to watch the marker for only a
// third of the TTL plus the Redis timeout, and with a 60 s TTL and the
// default 1 s timeout about one start in four went ahead beside the
// running instance. Scaled down: TTL 9 s, Redis timeout 100 ms, and the
// worst case every time: the running instance's loop always sleeps its
// longest (3.3 s, its jitter pinned to the most), and each second instance
// starts just after a refresh, so its check must wait out that whole gap.
func TestSecondInstanceBesideAnIdleOneIsRefused(t *testing.T) {
	vars := baseEnv()
	vars["HAN_INSTANCE_ID"] = "dupidle-" + ids.New()[:8]
	vars["HAN_INSTANCE_LIVENESS_TTL"] = "9s"
	vars["HAN_REDIS_TIMEOUT"] = "100ms"
	owner := NewMain()
	if err := owner.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	owner.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	owner.presenceJitter = func(spread time.Duration) time.Duration { return spread }
	if err := owner.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Close() }) // running, idle: no sockets
	admin := env.Redis.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	key := presence.InstanceKey(vars["HAN_INSTANCE_ID"])
	for attempt := range 2 {
		// Wait for the owner's next refresh: the check then starts with
		// the longest gap ahead of it.
		before, err := admin.Get(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() bool {
			v, err := admin.Get(context.Background(), key).Result()
			return err == nil && v != before
		}, "the running instance refreshes its liveness marker")
		second := NewMain()
		if err := second.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
			t.Fatal(err)
		}
		second.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
		err = second.Run(context.Background())
		_ = second.Close()
		if err == nil || !strings.Contains(err.Error(), "HAN_INSTANCE_ID") {
			t.Fatalf("attempt %d: a second instance with the HAN_INSTANCE_ID of a running idle one: Run error %v, want a refusal naming HAN_INSTANCE_ID",
				attempt, err)
		}
	}
}

// The check waits out the longest gap the owner's liveness loop can leave
// between two refreshes: here an owner (played by the test) whose loop
// slept its longest, 1.1 × a third of the TTL, refreshes the marker after
// the old window (a third of the TTL plus the Redis timeout) had ended.
// The check sees that refresh and refuses.
func TestInstanceIDCheckWaitsOutTheLongestLivenessGap(t *testing.T) {
	vars := baseEnv()
	vars["HAN_INSTANCE_ID"] = "slowowner-" + ids.New()[:8]
	vars["HAN_INSTANCE_LIVENESS_TTL"] = "9s"
	vars["HAN_REDIS_TIMEOUT"] = "100ms"
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	opt, err := redis.ParseURL(vars["REDIS_REALTIME_URL"])
	if err != nil {
		t.Fatal(err)
	}
	m.rt = redis.NewClient(opt)
	t.Cleanup(func() { _ = m.rt.Close() })
	admin := env.Redis.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	key := presence.InstanceKey(vars["HAN_INSTANCE_ID"])
	refresh := func() {
		now, err := admin.Time(ctx).Result()
		if err == nil {
			err = admin.Set(ctx, key, strconv.FormatInt(now.UnixMilli(), 10), 9*time.Second).Err()
		}
		if err != nil {
			t.Error(err)
		}
	}
	refresh()
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		time.Sleep(3 * time.Second * 11 / 10) // the liveness loop's longest sleep
		refresh()
	}()
	err = m.checkInstanceID(ctx)
	<-refreshed
	if err == nil || !strings.Contains(err.Error(), "HAN_INSTANCE_ID") {
		t.Fatalf("an owner refreshing its marker after its loop's longest sleep: check %v, want a refusal naming HAN_INSTANCE_ID", err)
	}
}
