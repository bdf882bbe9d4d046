// Command withpg starts one private PostgreSQL cluster, runs the given
// command with HAN_TEST_DATABASE_URL pointing at it (the superuser's random
// password included: it reaches the command in its environment only, and
// withpg never prints it), stops the cluster and exits with the command's
// status. scripts/test.sh runs `go test` through it
// so every test package shares one cluster (each in its own database).
//
// withpg -pgbouncer -- command also starts a private PgBouncer in transaction
// pooling mode in front of the cluster and hands the command its URL
// (same user, password and database) in HAN_TEST_PGBOUNCER_URL
// (scripts/bench-pgbouncer.sh).
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
	bouncer := false
	if len(args) > 0 && args[0] == "-pgbouncer" {
		bouncer, args = true, args[1:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg [-pgbouncer] -- command [args...]")
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
	var b *testenv.PgBouncer
	if bouncer {
		if b, err = testenv.StartPgBouncer(c.URL); err != nil {
			c.Stop()
			fmt.Fprintln(os.Stderr, "withpg:", err)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "withpg: private PgBouncer on %s (%s)\n", b.Addr(), b.Dir)
		cmd.Env = append(cmd.Env, "HAN_TEST_PGBOUNCER_URL="+b.URL(c.URL, ""), fmt.Sprintf("HAN_TEST_PGBOUNCER_PID=%d", b.Pid()))
	}
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
	b.Stop()
	c.Stop()
	os.Exit(code)
}
