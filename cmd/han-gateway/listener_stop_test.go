package main

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// A listener that stops on its own (here closed under the server, as an
// accept error Go does not retry would end it) is reported by Stopped with
// the error, and Close returns it, so main drains and exits 1 for its
// supervisor to restart it instead of running on with nothing served. A
// stop by Close is not such a report: its error is http.ErrServerClosed.
func TestAListenerThatStopsOnItsOwnIsReported(t *testing.T) {
	t.Run("on its own", func(t *testing.T) {
		m := runLogged(t, baseEnv(), io.Discard)
		t.Cleanup(func() { _ = m.Close() })
		stopped, why := m.Stopped()
		select {
		case <-stopped:
			t.Fatal("Stopped fired while serving")
		case <-time.After(100 * time.Millisecond):
		}
		_ = m.edge.Close()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the listener was closed and Stopped did not fire within 10 s")
		}
		if err := why(); err == nil || errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Stopped's error %v, want the listener's", err)
		}
		// main exits 1 on Close's error: the listener's is among it.
		if err := m.Close(); err == nil {
			t.Fatal("Close after the listener stopped on its own returned no error")
		}
	})
	t.Run("by Close", func(t *testing.T) {
		vars := baseEnv()
		vars["HAN_DRAIN_DELAY"] = "0s"
		m := runLogged(t, vars, io.Discard)
		stopped, why := m.Stopped()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		<-stopped
		if err := why(); !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("after Close: %v, want http.ErrServerClosed", err)
		}
	})
}
