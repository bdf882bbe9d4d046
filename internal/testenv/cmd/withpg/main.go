// Command withpg starts one private PostgreSQL cluster, runs the given
// command with HAN_TEST_DATABASE_URL pointing at it, stops the cluster and
// exits with the command's status. scripts/test.sh runs `go test` through it
// so every test package shares one cluster (each in its own database).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/han-app/gateway/internal/testenv"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg -- command [args...]")
		os.Exit(2)
	}
	c, err := testenv.StartPGCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "withpg:", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "withpg: private PostgreSQL on 127.0.0.1:%d (%s)\n", c.Port, c.Dir)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), testenv.ServerURLEnv+"="+c.URL)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	code := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "withpg:", err)
		code = 2
	} else {
		go func() {
			for s := range sig {
				_ = cmd.Process.Signal(s)
			}
		}()
		if err := cmd.Wait(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
				if code < 0 {
					code = 1
				}
			} else {
				code = 1
			}
		}
	}
	c.Stop()
	os.Exit(code)
}
