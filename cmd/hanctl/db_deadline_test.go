package main

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// boundedRun is what runBounded saw.
type boundedRun struct {
	out  string
	err  error
	took time.Duration
	hung bool // still running after the limit: cancelled, as an operator's Ctrl-C would
}

// runBounded runs hanctl with a context that only an operator's Ctrl-C
// would cancel (as main does); after limit it cancels (the operator gives
// up) and reports that it had to.
func runBounded(t *testing.T, limit time.Duration, extra map[string]string, args ...string) boundedRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		var b strings.Builder
		err := Run(ctx, args, getenv(extra), &b)
		done <- result{b.String(), err}
	}()
	var r boundedRun
	select {
	case res := <-done:
		r.out, r.err = res.out, res.err
	case <-time.After(limit):
		r.hung = true
		cancel()
		select {
		case res := <-done:
			r.out, r.err = res.out, res.err
		case <-time.After(30 * time.Second):
		}
	}
	r.took = time.Since(start)
	return r
}

// stallingPG is a TCP proxy to the test's PostgreSQL that stops passing
// anything, in either direction and on every connection, once a client
// sends trigger: a server that accepted the connection and then stalls.
func stallingPG(t *testing.T, trigger string) string {
	t.Helper()
	u, err := url.Parse(env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var stalled atomic.Bool
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	pipe := func(from, to net.Conn, watch bool) {
		buf := make([]byte, 64<<10)
		for {
			n, err := from.Read(buf)
			if n > 0 {
				if watch && bytes.Contains(buf[:n], []byte(trigger)) {
					stalled.Store(true)
				}
				if !stalled.Load() {
					if _, err := to.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go pipe(c, s, true)
			go pipe(s, c, false)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String()
}

// The PostgreSQL commands (hanctl migrate runs before every start of the
// service) fail after --timeout when PostgreSQL stalls after the
// connection check, naming the step that did not finish, instead of
// waiting until someone interrupts them.
func TestDBCommandsFailWhenPostgresStalls(t *testing.T) {
	if _, err := run(t, nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, nil, "migrate", "-h"); err != nil || !strings.Contains(out, "-timeout") || !strings.Contains(out, defaultDBTimeout.String()) {
		t.Fatalf("migrate -h must show --timeout and its default %s: %v\n%s", defaultDBTimeout, err, out)
	}
	const timeout = 2 * time.Second
	entries := filepath.Join(t.TempDir(), "entries.json")
	if err := os.WriteFile(entries, []byte(`[{"key":"a","type":"string","value":"1"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		trigger, step string
		args          []string
	}{
		{"FROM schema_migrations", "apply migrations", []string{"migrate"}},
		{"FROM schema_migrations", "apply migrations", []string{"seed", "demo"}},
		{"INSERT INTO projects", "create project", []string{"project", "create", "--name", "stalled", "--member", ids.New() + ":admin"}},
		// Redis is never reached: the project check comes first.
		{"SELECT EXISTS (SELECT 1 FROM projects", "check project", []string{"project", "legacy-import", "--project", ids.New(), "--file", entries}},
	} {
		t.Run(strings.Join(tc.args[:min(2, len(tc.args))], " "), func(t *testing.T) {
			dsn := stallingPG(t, tc.trigger)
			// Generous: the deadline, the wait for the connections to
			// close, and room for a slow machine.
			limit := timeout + closeWait + 25*time.Second
			vars := map[string]string{"DATABASE_URL": dsn, "REDIS_URL": "redis://127.0.0.1:1/0", "HAN_ENV": "stage"}
			r := runBounded(t, limit, vars, append(tc.args, "--timeout", timeout.String())...)
			if r.hung {
				t.Fatalf("hanctl %v against a stalled PostgreSQL still waiting after %s (returned only when cancelled: %v)\n%s",
					tc.args, limit, r.err, r.out)
			}
			if r.err == nil {
				t.Fatalf("hanctl %v against a stalled PostgreSQL succeeded:\n%s", tc.args, r.out)
			}
			if msg := r.err.Error(); !strings.HasPrefix(msg, tc.step+": timed out") || !strings.Contains(msg, "--timeout "+timeout.String()) {
				t.Fatalf("hanctl %v: %q, want the step %q named as timed out after --timeout %s", tc.args, msg, tc.step, timeout)
			}
		})
	}
	if _, err := run(t, nil, "migrate", "--timeout", "0s"); err == nil || !strings.Contains(err.Error(), "--timeout") {
		t.Fatalf("migrate --timeout 0s: %v", err)
	}
}
