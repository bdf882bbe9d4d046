package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// devStack runs scripts/dev.sh of this repository with its state in a
// temporary HAN_DEV_DATA and every port a free one, so a developer's own
// stack is not touched.
type devStack struct {
	root, data string
	env        []string
}

func newDevStack(t *testing.T) *devStack {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	// As root, PostgreSQL's folder is outside data (the postgres user cannot
	// enter a test's temporary folder); dev.sh names it in pg.location.
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(data, "pg.location")); err == nil {
			if dir := filepath.Dir(strings.TrimSpace(string(b))); strings.HasPrefix(dir, "/var/tmp/han-dev-") {
				_ = os.RemoveAll(dir)
			}
		}
	})
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "HAN_DEV_DATA=" + data,
		"HAN_HTTP_ADDR=127.0.0.1:0", "HAN_DEV_PG_PORT=0", "HAN_DEV_REDIS_PORT=0"}
	for _, k := range []string{"GOPATH", "GOCACHE", "GOMODCACHE", "GOFLAGS", "GOPROXY", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return &devStack{root: root, data: data, env: env}
}

// script is a bash command line run in the repository with the stack's
// environment.
func (d *devStack) script(args string) *exec.Cmd {
	c := exec.Command("bash", "-c", args)
	c.Dir, c.Env = d.root, d.env
	return c
}

func (d *devStack) stop() (string, error) {
	out, err := d.script("scripts/dev.sh --stop").CombinedOutput()
	return string(out), err
}

// The local stack as a newcomer drives it: scripts/dev.sh started in the
// background (as `scripts/dev.sh &` does, SIGINT ignored), `eval "$(scripts/dev.sh
// --env)"` then `hanctl token` mints a token the running gateway accepts,
// and `scripts/dev.sh --stop` stops the gateway, Redis and PostgreSQL.
// It builds bin/ and starts PostgreSQL: skipped with -short.
func TestDevScriptEnvAndStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole dev stack")
	}
	d := newDevStack(t)
	data, script, stop := d.data, d.script, d.stop
	log := filepath.Join(data, "dev.log")
	if out, err := script("scripts/dev.sh </dev/null >" + log + " 2>&1 &").CombinedOutput(); err != nil {
		t.Fatalf("start: %v %s", err, out)
	}
	t.Cleanup(func() { _, _ = stop() })
	devLog := func() string { b, _ := os.ReadFile(log); return string(b) }

	// The stack is up once it wrote its addresses.
	deadline := time.Now().Add(8 * time.Minute)
	for {
		if fi, err := os.Stat(filepath.Join(data, "run", "stack.env")); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) || strings.Contains(devLog(), "error:") {
			t.Fatalf("the dev stack did not come up:\n%s", devLog())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(devLog(), "first build takes minutes") {
		t.Errorf("no build progress line:\n%s", devLog())
	}
	devTokensAreShortLived(t, filepath.Join(data, "demo.json"), devLog)

	out, err := script("scripts/dev.sh --env").Output()
	if err != nil {
		t.Fatalf("dev.sh --env: %v", err)
	}
	for _, v := range []string{"HAN_BASE_URL", "DATABASE_URL", "REDIS_URL", "REDIS_REALTIME_URL", "HAN_JWT_DEV_HS256_SECRET"} {
		if !strings.Contains(string(out), "export "+v+"=") {
			t.Errorf("dev.sh --env lacks %s:\n%s", v, out)
		}
	}
	// Its output as is, with hanctl token, then the token against the stack.
	const alice = "00000000-0000-7000-8000-00000000a11c"
	tokOut, err := script(`eval "$(scripts/dev.sh --env)" && bin/hanctl token --sub ` + alice + ` && echo "$HAN_BASE_URL"`).Output()
	if err != nil {
		t.Fatalf("eval dev.sh --env; hanctl token: %v %s", err, tokOut)
	}
	lines := strings.Fields(string(tokOut))
	if len(lines) != 2 {
		t.Fatalf("hanctl token output: %q", tokOut)
	}
	tok, base := lines[0], lines[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/me", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/me with the hanctl token: %d", resp.StatusCode)
	}

	if out, err := stop(); err != nil || !strings.Contains(out, "stopped") {
		t.Fatalf("dev.sh --stop: %v %s", err, out)
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("the gateway still answers at %s after --stop", base)
	}
	for _, f := range []string{"stack.env", "dev.pid", "gateway.pid", "redis.pid"} {
		if _, err := os.Stat(filepath.Join(data, "run", f)); err == nil {
			t.Errorf("run/%s left after --stop", f)
		}
	}
	if !strings.Contains(devLog(), "dev.sh: stopped") {
		t.Errorf("dev.sh did not stop the stack itself:\n%s", devLog())
	}
	if out, err := script("scripts/dev.sh --env").CombinedOutput(); err == nil {
		t.Fatalf("dev.sh --env with no stack running succeeded: %s", out)
	}
}

// devTokensAreShortLived: the demo tokens dev.sh prints, and the sign-in
// links that carry them, expire within an hour by default (a link stays in
// the browser's history, token included), and the banner says how to mint
// fresh ones.
func devTokensAreShortLived(t *testing.T, demoFile string, devLog func() string) {
	t.Helper()
	b, err := os.ReadFile(demoFile)
	if err != nil {
		t.Fatal(err)
	}
	var demo struct{ Tokens map[string]string }
	if err := json.Unmarshal(b, &demo); err != nil || len(demo.Tokens) == 0 {
		t.Fatalf("demo.json: %v %s", err, b)
	}
	for name, tok := range demo.Tokens {
		parts := strings.Split(tok, ".")
		var claims struct{ Exp int64 }
		if len(parts) != 3 {
			t.Fatalf("%s's demo token is not a JWT", name)
		}
		payload, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil || json.Unmarshal(payload, &claims) != nil {
			t.Fatalf("%s's demo token: unreadable claims", name)
		}
		if left := time.Until(time.Unix(claims.Exp, 0)); left > time.Hour || left < 50*time.Minute {
			t.Errorf("%s's demo token expires in %s, want about an hour", name, left.Round(time.Second))
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(devLog(), "HAN dev stack is up") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(devLog(), "tokens valid 1h") || !strings.Contains(devLog(), "bin/hanctl token --sub ") {
		t.Errorf("the banner does not say how long the demo tokens last and how to mint fresh ones:\n%s", devLog())
	}
}
