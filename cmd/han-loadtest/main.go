// Command han-loadtest is the k6-style load generator of the HAN gateway:
// `han-loadtest run SCENARIO [flags]` runs a scenario against a loopback
// target and exits non-zero when a threshold fails; `han-loadtest
// baseline-server` serves the minimal broadcast server runs compare with.
// See docs/loadtest.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		if err == errHelp {
			os.Exit(ExitOK)
		}
		fmt.Fprintln(os.Stderr, "han-loadtest:", err)
		os.Exit(ExitUsage)
	}
	code := m.Run(ctx)
	if err := m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "han-loadtest:", err)
	}
	os.Exit(code)
}
