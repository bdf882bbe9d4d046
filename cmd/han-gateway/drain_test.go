package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// startProgram runs the real main() (this test binary with runMainEnv set)
// with vars as its whole environment and returns it with its stderr log
// lines, one JSON object per line, on a channel closed at EOF.
func startProgram(t *testing.T, vars map[string]string, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "TMPDIR=" + os.TempDir()}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	return cmd, lines
}

type logLine struct {
	Msg     string `json:"msg"`
	Addr    string `json:"addr"`
	Sockets *int   `json:"sockets"`
	Code    *int   `json:"code"`
	// GoMaxProcs is the "serving" line's gomaxprocs.
	GoMaxProcs *int `json:"gomaxprocs"`
	// GOGC is the "serving" line's gogc: the collector's target.
	GOGC *int `json:"gogc"`
}

// SIGTERM as a load balancer sees it: /readyz answers 503 for
// HAN_DRAIN_DELAY while the listener still serves requests and sockets
// stay open; then the listener stops accepting, sockets are closed with
// 1001 and a reconnect delay, and the process exits 0, logging each step.
func TestSIGTERMDrainKeepsServingWhileReadyzIs503(t *testing.T) {
	const delay = 3 * time.Second
	vars := baseEnv()
	vars["HAN_DRAIN_DELAY"] = delay.String()
	vars["HAN_SHUTDOWN_TIMEOUT"] = "15s"
	vars["HAN_LOG_LEVEL"] = "info"
	vars["HAN_BLOB_DIR"] = t.TempDir()
	// The "serving" line tells an operator how many cores the Go code
	// runs on (docs/runbook.md, "Cores"): the environment's value here.
	vars["GOMAXPROCS"] = "3"
	vars["GOGC"] = "150" // and its collector's target (docs/runbook.md, "Memory")
	cmd, lines := startProgram(t, vars)

	var logs []logLine
	next := func(what string) logLine {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("log ended before %q; got %+v", what, logs)
				}
				var v logLine
				if json.Unmarshal([]byte(l), &v) != nil {
					t.Fatalf("log line is not JSON: %s", l)
				}
				logs = append(logs, v)
				if strings.HasPrefix(v.Msg, what) {
					return v
				}
			case <-timeout:
				t.Fatalf("no log line %q; got %+v", what, logs)
			}
		}
	}
	serving := next("serving")
	if serving.GoMaxProcs == nil || *serving.GoMaxProcs != 3 {
		t.Fatalf("serving line gomaxprocs = %v, want 3 (GOMAXPROCS)", serving.GoMaxProcs)
	}
	if serving.GOGC == nil {
		t.Fatal("serving line has no gogc")
	}
	if *serving.GOGC != 150 {
		t.Fatalf("serving line gogc = %d, want 150 (GOGC)", *serving.GOGC)
	}
	base := "http://" + serving.Addr

	// Fresh connections each time, as a load balancer's probes make them.
	client := &http.Client{Timeout: 10 * time.Second, Transport: apiCheck.Transport(&http.Transport{DisableKeepAlives: true})}
	get := func(path, tok string) (int, string, error) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	tok, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: ids.New(), Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if code, body, err := get("/v1/me", tok); code != 200 {
		t.Fatalf("/v1/me before SIGTERM: %d %s %v", code, body, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/realtime", &websocket.DialOptions{
		Subprotocols: []string{"han.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"hello"`) {
		t.Fatalf("hello: %s %v", b, err)
	}
	// The client keeps reading, as browsers do, so it sees the close frame.
	closed := make(chan websocket.CloseError, 1)
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				var ce websocket.CloseError
				errors.As(err, &ce)
				closed <- ce
				return
			}
		}
	}()

	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Readiness turns 503 while the same listener still answers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := get("/readyz", "")
		if err != nil {
			t.Fatalf("/readyz during the drain delay: %v", err)
		}
		if code == 503 {
			if !strings.Contains(body, `"status":"draining"`) {
				t.Fatalf("/readyz 503 body: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %s after SIGTERM", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body, err := get("/v1/me", tok); code != 200 {
		t.Fatalf("/v1/me while /readyz is 503: %d %s %v", code, body, err)
	}
	select {
	case ce := <-closed:
		t.Fatalf("socket closed (%d %q) while the listener should still be serving", ce.Code, ce.Reason)
	default:
	}

	// Then the socket gets 1001 with a reconnect delay, not before the delay.
	select {
	case ce := <-closed:
		var v struct{ RetryMs *int }
		if ce.Code != websocket.StatusGoingAway || json.Unmarshal([]byte(ce.Reason), &v) != nil || v.RetryMs == nil {
			t.Fatalf("drain close: %d %q", ce.Code, ce.Reason)
		}
		if since := time.Since(signalled); since < delay {
			t.Fatalf("socket closed %v after SIGTERM, before the %v drain delay", since, delay)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("socket not closed by the drain")
	}
	// The listener closed before the sockets did.
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second); err == nil {
		c.Close()
		t.Fatal("listener still accepting after the sockets were drained")
	}

	for _, step := range []string{"drain started", "drain: delay over, listener closed", "drain: sockets closed with 1001",
		"drain: in-flight requests finished", "drain: Redis and PostgreSQL connections closed"} {
		l := next(step)
		if step == "drain: sockets closed with 1001" && (l.Sockets == nil || *l.Sockets != 1) {
			t.Errorf("sockets drained: %+v, want 1", l.Sockets)
		}
	}
	if l := next("exit"); l.Code == nil || *l.Code != 0 {
		t.Errorf("exit log line: %+v", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v (want status 0)", err)
	}
}
