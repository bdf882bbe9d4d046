package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const runMainEnv = "HANCTL_TEST_RUN_MAIN"

// Every command answers -h / --help with exit status 0 and help that
// names the environment variables it reads, even with none of them set.
func TestHelpExitsZeroAndNamesTheEnvironment(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args string
		want []string
	}{
		{"-h", []string{"hanctl token", "hanctl redis verify"}},
		{"--help", []string{"hanctl migrate"}},
		{"help", []string{"hanctl sizing"}},
		{"migrate -h", []string{"DATABASE_URL", "HAN_DATABASE_DIRECT_URL", "HAN_DB_EXEC_MODE"}},
		{"token -h", []string{"HAN_JWT_DEV_HS256_SECRET", "-sub"}},
		{"token --help", []string{"HAN_JWT_DEV_HS256_SECRET", "-ttl"}},
		{"project -h", []string{"hanctl project create", "hanctl project legacy-import"}},
		{"project create -h", []string{"DATABASE_URL", "HAN_DATABASE_DIRECT_URL", "-member"}},
		{"project legacy-import -h", []string{"REDIS_URL", "HAN_ENV", "DATABASE_URL", "HAN_DATABASE_DIRECT_URL", "-file"}},
		{"seed -h", []string{"hanctl seed demo"}},
		{"seed demo -h", []string{"DATABASE_URL", "HAN_DATABASE_DIRECT_URL", "HAN_JWT_DEV_HS256_SECRET", "-ttl"}},
		{"redis -h", []string{"hanctl redis acl", "hanctl redis cutover"}},
		{"redis acl -h", []string{"HAN_REDIS_API_PASSWORD", "REDIS_URL", "-out"}},
		{"redis cutover -h", []string{"HAN_REDIS_ADMIN_URL", "-force"}},
		{"redis verify -h", []string{"HAN_REDIS_ADMIN_URL"}},
		{"sizing -h", []string{"REDIS_URL", "-sample"}},
	} {
		t.Run(tc.args, func(t *testing.T) {
			cmd := exec.Command(exe, strings.Fields(tc.args)...)
			cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("hanctl %s: %v, stderr %q", tc.args, err, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("hanctl %s: help lacks %q:\n%s", tc.args, w, out)
				}
			}
		})
	}
	// A bad flag still fails, with the message once on stderr.
	cmd := exec.Command(exe, "token", "--nope")
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Count(string(out), "-nope") != 1 {
		t.Fatalf("hanctl token --nope: %v %q", err, out)
	}
}
