package clustertest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// The whole-gateway tests run the real program: cmd/han-gateway built
// once per test binary and started as child processes, each instance with
// its own id, all on one cluster for both Redis roles and on the
// package's PostgreSQL database.

const gwDevSecret = "clustertest-gateway-secret-0123456789"

var (
	gwBuildDir string // the build's folder, removed after the tests
	gwBuild    = sync.OnceValues(buildGateway)
)

func buildGateway() (string, error) {
	dir, err := os.MkdirTemp("", "han-clustertest-bin-")
	if err != nil {
		return "", err
	}
	gwBuildDir = dir
	bin := filepath.Join(dir, "han-gateway")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	args := []string{"build", "-o", bin}
	if raceBuild {
		args = append(args, "-race")
	}
	out, err := exec.Command(goTool, append(args, "github.com/han-app/gateway/cmd/han-gateway")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build han-gateway: %v: %s", err, out)
	}
	return bin, nil
}

// removeGatewayBuild removes the built program once the tests are over.
func removeGatewayBuild() error {
	if gwBuildDir == "" {
		return nil
	}
	return os.RemoveAll(gwBuildDir)
}

// gw is one running han-gateway process.
type gw struct {
	name, id string
	// run names the instances started together; it keys their IP-hashing
	// secret, so the per-IP rate-limit counts of one test's requests (all
	// from 127.0.0.1, on the cluster every test shares) never carry over
	// into another test's.
	run      string
	addr     string // host:port it listens on
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	mu       sync.Mutex    // guards problems, raw
	problems []string      // its WARN and ERROR log lines, for a failing test's report
	raw      []string      // its output that is not a log line: a panic, a race report
}

func (g *gw) url() string { return "http://" + g.addr }

// startGateways starts n instances on cluster c and waits until each
// serves; they are stopped (SIGTERM, then SIGKILL) when the test ends.
func startGateways(t *testing.T, c *testenv.RedisCluster, n int) []*gw {
	t.Helper()
	bin, err := gwBuild()
	if err != nil {
		t.Fatal(err)
	}
	run := ids.New()[:8]
	gws := make([]*gw, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		g := &gw{name: string(rune('A' + i)), done: make(chan struct{})}
		g.id, g.run = "clgw-"+run+"-"+g.name, run
		gws[i] = g
		dir := t.TempDir()
		wg.Go(func() { errs[i] = g.start(bin, c, dir) })
	}
	wg.Wait()
	t.Cleanup(func() {
		var sw sync.WaitGroup
		for _, g := range gws {
			sw.Go(g.stop)
		}
		sw.Wait()
		for _, g := range gws {
			g.checkExit(t)
		}
		if t.Failed() {
			for _, g := range gws {
				g.mu.Lock()
				for _, l := range g.problems[max(0, len(g.problems)-15):] {
					t.Logf("gateway %s: %s", g.name, l)
				}
				g.mu.Unlock()
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("gateway %s: %v", gws[i].name, err)
		}
	}
	return gws
}

func (g *gw) start(bin string, c *testenv.RedisCluster, dir string) error {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"HAN_HTTP_ADDR=127.0.0.1:0", "HAN_INSTANCE_ID="+g.id,
		"REDIS_URL="+c.URL(), "REDIS_REALTIME_URL="+c.URL(), "DATABASE_URL="+env.DatabaseURL,
		"HAN_JWT_DEV_HS256_SECRET="+gwDevSecret, "HAN_HMAC_SECRET=clustertest-hmac-"+g.run+"-0123456789",
		"HAN_LOG_LEVEL=info", "HAN_DRAIN_DELAY=0", "HAN_SHUTDOWN_TIMEOUT=5s",
		// An event whose publish failed while a master was away reaches
		// the sockets through the outbox relay a second later.
		"HAN_OUTBOX_GRACE=1s", "HAN_BLOB_DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	g.cmd = cmd
	serving := make(chan string, 1)
	go func() {
		defer close(g.done)
		g.readLog(stderr, serving)
		_ = cmd.Wait()
	}()
	select {
	case g.addr = <-serving:
	case <-g.done:
		return fmt.Errorf("exited before serving: %s", g.lastProblems())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("not serving within 60s: %s", g.lastProblems())
	}
	// Serving is not ready: wait for /readyz (PostgreSQL reachable).
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.url() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz not 200 within 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readLog reads the JSON log until the process closes it: the "serving"
// line names the bound address, WARN and ERROR lines are kept.
func (g *gw) readLog(r io.Reader, serving chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Addr  string `json:"addr"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			g.mu.Lock()
			if len(g.raw) < 200 {
				g.raw = append(g.raw, sc.Text())
			}
			g.mu.Unlock()
			continue
		}
		switch {
		case l.Msg == "serving" && l.Addr != "":
			select {
			case serving <- l.Addr:
			default:
			}
		case l.Level == "WARN" || l.Level == "ERROR":
			g.mu.Lock()
			if len(g.problems) < 1000 {
				g.problems = append(g.problems, sc.Text())
			}
			g.mu.Unlock()
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// checkExit fails the test unless the instance drained and exited 0 with
// nothing on its output but log lines (no panic, no race report).
func (g *gw) checkExit(t *testing.T) {
	t.Helper()
	if g.cmd == nil || g.cmd.ProcessState == nil {
		return
	}
	g.mu.Lock()
	raw := strings.Join(g.raw, "\n")
	g.mu.Unlock()
	if code := g.cmd.ProcessState.ExitCode(); code != 0 || raw != "" {
		t.Errorf("gateway %s exited with %d (0 after a drain), output besides its log:\n%s", g.name, code, raw)
	}
}

func (g *gw) lastProblems() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.problems[max(0, len(g.problems)-5):], "\n")
}

func (g *gw) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// userToken mints a user token the instances accept.
func userToken(t *testing.T, userID string) string {
	t.Helper()
	tok, err := auth.MintDevToken([]byte(gwDevSecret), auth.DevClaims{Subject: userID, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// gwClient is the HTTP client of the tests: bounded, so that a request
// to an instance waiting on a dead master cannot hang a test.
var gwClient = &http.Client{Timeout: 15 * time.Second}

// apiCall sends one request; a transport error is returned, not fatal
// (the traffic of the fault tests retries it).
func apiCall(method, url, tok, body string, hdr map[string]string) (int, string, http.Header, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := gwClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// mustCall sends one request and fails the test unless the answer has
// status want; it returns the body.
func mustCall(t *testing.T, want int, method, url, tok, body string, hdr map[string]string) string {
	t.Helper()
	code, b, _, err := apiCall(method, url, tok, body, hdr)
	if err != nil || code != want {
		t.Fatalf("%s %s: %d %s (%v), want %d", method, url, code, b, err, want)
	}
	return b
}

// jsonField decodes body and returns its top-level string field name.
func jsonField(t *testing.T, body, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("undecodable answer %q: %v", body, err)
	}
	s, _ := m[name].(string)
	if s == "" {
		t.Fatalf("answer %s has no %q", body, name)
	}
	return s
}

// userOn returns a new user id whose user channel lives on master, and
// its token, after a first request made the user known.
func userOn(t *testing.T, c *testenv.RedisCluster, g *gw, master *testenv.RedisServer) (string, string) {
	t.Helper()
	for range 1000 {
		u := ids.New()
		m, err := c.MasterOf(context.Background(), pubsub.UserChannel(u))
		if err != nil {
			t.Fatal(err)
		}
		if m == master {
			tok := userToken(t, u)
			mustCall(t, 200, "GET", g.url()+"/v1/me", tok, "", nil)
			return u, tok
		}
	}
	t.Fatalf("no user channel on master %s", master.Addr())
	return "", ""
}

// createDialog creates a dialog of creator and members through g and
// returns its id.
func createDialog(t *testing.T, g *gw, creatorTok string, members ...string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"memberIds": members})
	return jsonField(t, mustCall(t, 201, "POST", g.url()+"/v1/dialogs", creatorTok, string(body), nil), "id")
}

// decodeInto decodes an answer's body into v.
func decodeInto(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("undecodable answer %q: %v", body, err)
	}
}
