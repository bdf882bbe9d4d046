package main

import (
	"bytes"
	"io"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// After Main.Close no goroutine of the service's own packages is
// left running (the relay, the purger, the janitor, the marker, the
// publisher's batcher, presence, the subscriber).
func TestCloseLeavesNoServiceGoroutines(t *testing.T) {
	m := runLogged(t, baseEnv(), io.Discard)
	dialogWithSends(t, m, 20, "leak")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	var left []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		left = left[:0]
		var dump bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
		for _, g := range strings.Split(dump.String(), "\n\n") {
			if strings.Contains(g, "github.com/han-app/gateway/") && !strings.Contains(g, "TestCloseLeaves") &&
				!strings.Contains(g, "testing.(*T)") && !strings.Contains(g, "testenv") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("%d service goroutines still running 5 s after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}
