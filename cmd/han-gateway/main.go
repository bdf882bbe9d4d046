// Command han-gateway is the HAN realtime gateway: the WebSocket endpoint and
// the REST API of one instance. Configuration comes from the environment
// (see README; -h lists the essentials). SIGINT/SIGTERM drain and stop it:
// /readyz turns 503 while it serves on for HAN_DRAIN_DELAY, then sockets
// close with 1001 and it exits 0 (docs/runbook.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:], os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "han-gateway:", err)
		os.Exit(2)
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "han-gateway:", err)
		_ = m.Close()
		os.Exit(1)
	}
	stopped, why := m.Stopped()
	select {
	case <-ctx.Done():
	case <-stopped:
		// The listener stopped on its own: nothing is served any more, so
		// the instance drains what it holds and exits non-zero (Close
		// returns the listener's error) for its supervisor to restart it.
		m.Logger.Error("listener stopped", "error", why().Error())
	}
	// A second signal while draining ends the process at once.
	stop()
	if err := m.Close(); err != nil {
		m.Logger.Error("exit", "code", 1, "error", err.Error())
		os.Exit(1)
	}
	m.Logger.Info("exit", "code", 0)
}
