package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const runMainEnv = "HAN_LOADTEST_TEST_RUN_MAIN"

// Every command answers -h / --help with exit status 0 on stdout; run's
// help names the environment variables a gateway target reads.
func TestHelpExitsZero(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args string
		want []string
	}{
		{"-h", []string{"han-loadtest run SCENARIO", "baseline-server"}},
		{"--help", []string{"han-loadtest scenarios"}},
		{"run -h", []string{"HAN_JWT_DEV_HS256_SECRET", "REDIS_REALTIME_URL"}},
		{"run broadcast -h", []string{"HAN_JWT_DEV_HS256_SECRET", "-target", "-threshold"}},
		{"run broadcast --help", []string{"-duration"}},
		{"scenarios -h", []string{"han-loadtest scenarios"}},
		{"baseline-server -h", []string{"-addr"}},
	} {
		t.Run(tc.args, func(t *testing.T) {
			cmd := exec.Command(exe, strings.Fields(tc.args)...)
			cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("han-loadtest %s: %v, stderr %q", tc.args, err, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("han-loadtest %s: help lacks %q:\n%s", tc.args, w, out)
				}
			}
		})
	}
}
