//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

// captureStderr points the process's file descriptor 2 at a pipe (so the
// capture sees what any code writes to stderr, whatever *os.File it holds)
// until the returned function restores it and returns the captured lines.
func captureStderr(t *testing.T) (stop func() []string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup3(int(w.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	lines := make(chan []string, 1)
	go func() {
		var out []string
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			out = append(out, sc.Text())
		}
		lines <- out
	}()
	var got []string
	done := false
	stop = func() []string {
		if !done {
			done = true
			_ = syscall.Dup3(saved, 2, 0)
			_ = syscall.Close(saved)
			_ = w.Close()
			got = <-lines
			_ = r.Close()
		}
		return got
	}
	t.Cleanup(func() { stop() })
	return stop
}

// With its Redis killed for about three seconds, the real program writes
// nothing but JSON lines to stderr: go-redis's own connection-pool reports
// go through the service's logger, rate-limited, and no line carries the
// Redis password.
func TestRedisOutageLogsOnlyJSON(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	u, err := url.Parse(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()

	stop := captureStderr(t)
	began := time.Now()
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	// No Logger set: Run builds the production one, on stderr.
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	tok := mintToken(t, ids.New())
	if code, body := call(t, "GET", m.URL()+"/v1/me", tok, ""); code != 200 {
		t.Fatalf("/v1/me: %d %s", code, body)
	}

	r.Kill()
	outage := time.Now()
	for time.Since(outage) < 3*time.Second {
		call(t, "GET", m.URL()+"/readyz", "", "")
		call(t, "GET", m.URL()+"/v1/me", tok, "")
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		_, body := call(t, "GET", m.URL()+"/readyz", "", "")
		return strings.Contains(body, `"status":"ok"`)
	}, "the service never became ready again after Redis came back")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(began)
	lines := stop()

	redisLines := 0
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("a stderr line is not JSON: %q", l)
			continue
		}
		if password != "" && strings.Contains(l, password) {
			t.Errorf("a stderr line holds the Redis password: %q", l)
		}
		if rec["msg"] == "redis client" {
			redisLines++
		}
	}
	if redisLines == 0 {
		t.Fatalf("no go-redis line went through the service's logger during the outage (%d lines)", len(lines))
	}
	// At most RedisLogLinesPerSecond in each one-second window of the run.
	if most := rds.RedisLogLinesPerSecond * (int(elapsed/time.Second) + 2); redisLines > most {
		t.Fatalf("%d go-redis lines in %v, over the limit of %d a second", redisLines, elapsed, rds.RedisLogLinesPerSecond)
	}
	t.Logf("%d stderr lines, %d from go-redis", len(lines), redisLines)
}
