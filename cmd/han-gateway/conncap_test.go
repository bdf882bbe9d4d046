package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// HAN_MAX_CONNECTIONS above what the descriptor limit leaves after the
// pools and the reserve is refused at start-up, naming the variable and
// the largest value that fits. Accepted, the cap never triggered: client
// connections used up the descriptors first, so accept failed with EMFILE
// (clients hung unanswered instead of getting 503 overloaded) and the Redis
// and PostgreSQL pools could not dial.
func TestMaxConnectionsAboveTheDescriptorLimitIsRefused(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	vars := baseEnv()
	vars["HAN_MAX_CONNECTIONS"] = strconv.FormatUint(min(lim.Cur, 1<<30), 10)
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	err := m.Run(context.Background())
	t.Cleanup(func() { _ = m.Close() })
	if err == nil {
		t.Fatalf("started with HAN_MAX_CONNECTIONS=%s, the whole descriptor limit (%d)", vars["HAN_MAX_CONNECTIONS"], lim.Cur)
	}
	msg := err.Error()
	if !strings.Contains(msg, "HAN_MAX_CONNECTIONS") || !strings.Contains(msg, "at most") {
		t.Fatalf("start-up error %q: want it to name HAN_MAX_CONNECTIONS and the largest value that fits", msg)
	}
}
