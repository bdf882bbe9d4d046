package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// sdkDir is the JavaScript SDK, relative to this package.
const sdkDir = "../../web/sdk"

// sdkInstance is the gateway the SDK's Node tests talk to. Restarts keep its
// address, so clients reconnect to the same URL as they would to a
// restarted instance behind a load balancer.
type sdkInstance struct {
	t    *testing.T
	vars map[string]string
	rt   *testenv.RedisServer // the realtime Redis (DB1), private to this test
	mu   sync.Mutex           // guards m
	m    *Main
	// dropNextSend: the proxy forwards the next message send, restarts the
	// instance once it answered, and cuts the client's connection instead of
	// answering: the send committed, but the client never heard of it.
	dropNextSend atomic.Bool
	// stalled counts the connections made through the stalling proxy.
	stalled atomic.Int64
}

// stall serves a TCP proxy in front of the instance that passes everything
// the client sends and nothing the instance answers: a hung instance or a
// path that black-holes one direction.
func (s *sdkInstance) stall(l net.Listener, upstream string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.stalled.Add(1)
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { _, _ = io.Copy(io.Discard, up) }()
			_, _ = io.Copy(up, c)
		}()
	}
}

func (s *sdkInstance) current() *Main {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

func (s *sdkInstance) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.m.Close(); err != nil {
		return err
	}
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return s.vars[k] }); err != nil {
		return err
	}
	m.Logger = s.m.Logger
	var err error
	// The old listener's port is free once Close returned; retry briefly
	// in case the kernel has not released it yet.
	for i := 0; i < 50; i++ {
		if err = m.Run(context.Background()); err == nil {
			s.m = m
			return nil
		}
		_ = m.Close()
		m = NewMain()
		_ = m.ParseFlags(nil, func(k string) string { return s.vars[k] })
		m.Logger = s.m.Logger
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// control serves the Node tests' requests: /token mints a user token (a
// service token with kind=service), /dialogs creates n dialogs between
// owner and member and answers their ids, /restart restarts the instance,
// /restart-realtime-redis restarts its Pub/Sub Redis, /commit-unpublished
// stores a message without publishing it, /drop-next-send arms the cut
// answer, /stalled counts the connections made through the stalling proxy.
func (s *sdkInstance) control(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/token":
		ttl, err := strconv.Atoi(r.URL.Query().Get("ttl"))
		if err != nil || ttl <= 0 {
			ttl = 3600
		}
		c := auth.DevClaims{Subject: r.URL.Query().Get("sub"), Kind: auth.KindUser, TTL: time.Duration(ttl) * time.Second}
		if r.URL.Query().Get("kind") == "service" {
			c.Kind, c.Service = auth.KindService, "notifier"
		}
		tok, err := auth.MintDevToken([]byte(devSecret), c)
		if err != nil {
			http.Error(w, "mint", http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, tok)
	case "/restart":
		if err := s.restart(); err != nil {
			s.t.Errorf("restart: %v", err)
			http.Error(w, "restart failed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "/commit-unpublished":
		// A message committed without its event: what a subscriber sees
		// when Pub/Sub loses a publish (a gap in seq).
		q := r.URL.Query()
		msg, _, _, err := store.New(s.current().pg).SendMessage(r.Context(), store.SendMessage{
			ID: ids.New(), DialogID: q.Get("dialog"), SenderID: q.Get("sender"), Body: q.Get("body")})
		if err != nil {
			s.t.Errorf("commit unpublished: %v", err)
			http.Error(w, "commit failed", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, strconv.FormatInt(msg.Seq, 10))
	case "/restart-realtime-redis":
		// The instance's Pub/Sub link drops and comes back: its sockets
		// get resync pubsub_reconnect.
		if err := s.rt.Restart(); err != nil {
			s.t.Errorf("restart realtime redis: %v", err)
			http.Error(w, "restart failed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "/drop-next-send":
		s.dropNextSend.Store(true)
		w.WriteHeader(http.StatusNoContent)
	case "/dialogs":
		q := r.URL.Query()
		n, _ := strconv.Atoi(q.Get("n"))
		owner, member := q.Get("owner"), q.Get("member")
		st := store.New(s.current().pg)
		for _, u := range []string{owner, member} {
			if err := st.EnsureUser(r.Context(), u); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		out := make([]string, 0, n)
		for i := 0; i < n; i++ {
			d, err := st.CreateDialog(r.Context(), ids.New(), owner, "d"+strconv.Itoa(i), []string{member})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			out = append(out, d.ID)
		}
		_ = json.NewEncoder(w).Encode(out)
	case "/stalled":
		_, _ = io.WriteString(w, strconv.FormatInt(s.stalled.Load(), 10))
	default:
		http.NotFound(w, r)
	}
}

// proxy passes REST calls to the current instance, and cuts the answer of
// one armed send after restarting the instance.
func (s *sdkInstance) proxy(w http.ResponseWriter, r *http.Request) {
	target, _ := url.Parse(s.current().URL())
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages") && s.dropNextSend.CompareAndSwap(true, false) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target.String()+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			s.t.Errorf("armed send: %v", err)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				s.t.Errorf("armed send answered %d, want 201", resp.StatusCode)
			}
		}
		if err := s.restart(); err != nil {
			s.t.Errorf("restart: %v", err)
		}
		panic(http.ErrAbortHandler) // closes the client's connection without an answer
	}
	httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
}

// The JavaScript SDK's Node tests (web/sdk/test) against the real program:
// connect, subscribe, send, history, typing, presence, in-band refresh,
// subscribes for 150 dialogs under the frame rate, a refused ticket that
// stops the client, a hung connection given up and retried, reconnect and
// reconciliation after an instance restart, and a send retried across a
// restart that yields exactly one message. It needs node
// and the SDK's npm packages (scripts/test.sh runs npm ci when they are
// missing); without them it fails.
func TestJavaScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found in PATH: the SDK tests need Node.js 20+")
	}
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "ws")); err != nil {
		t.Fatal("web/sdk/node_modules is missing: run `npm ci` in web/sdk (scripts/test.sh does it)")
	}
	files, _ := filepath.Glob(filepath.Join(sdkDir, "test", "*.test.js"))
	if len(files) == 0 {
		t.Fatal("no web/sdk/test/*.test.js")
	}
	sort.Strings(files)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	rt, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
	vars := baseEnv()
	vars["HAN_HTTP_ADDR"] = addr
	vars["REDIS_REALTIME_URL"] = rt.URL(1)
	s := &sdkInstance{t: t, vars: vars, rt: rt}
	s.m = start(t, vars)
	t.Cleanup(func() { _ = s.current().Close() })
	ctl := httptest.NewServer(http.HandlerFunc(s.control))
	defer ctl.Close()
	api := httptest.NewServer(http.HandlerFunc(s.proxy))
	defer api.Close()
	stall, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	go s.stall(stall, addr)

	// Each test has 90 s; a hung one fails with its name instead of the
	// whole run hitting the context deadline.
	args := []string{"--test", "--test-reporter=spec", "--test-timeout=90000"}
	for _, f := range files {
		args = append(args, filepath.Join("test", filepath.Base(f)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = sdkDir
	// node --test runs each file in a child process: on timeout the whole
	// process group goes, and Wait does not hang on their pipes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(),
		"HAN_SDK_API_URL="+api.URL,
		"HAN_SDK_REALTIME_URL=ws://"+addr+"/v1/realtime",
		"HAN_SDK_CONTROL_URL="+ctl.URL,
		"HAN_SDK_ORIGIN="+vars["HAN_ALLOWED_ORIGINS"],
		"HAN_SDK_STALL_URL=ws://"+stall.Addr().String()+"/v1/realtime",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("SDK tests failed: %v", err)
	}
}
