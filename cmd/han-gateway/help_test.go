package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// -h and --help print the flags and the environment the gateway needs and
// exit 0, with no environment set; a bad flag exits 2.
func TestHelpExitsZero(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args string
		code int
		want []string
	}{
		{"-h", 0, []string{"REDIS_URL", "DATABASE_URL", "HAN_HMAC_SECRET", "HAN_DRAIN_DELAY", "-addr", "-migrate"}},
		{"--help", 0, []string{"REDIS_REALTIME_URL", "-debug-endpoints"}},
		{"-nope", 2, []string{"flag provided but not defined: -nope"}},
	} {
		cmd := exec.Command(exe, strings.Fields(tc.args)...)
		cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("han-gateway %s: exit %d, want %d:\n%s", tc.args, code, tc.code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("han-gateway %s: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}
