package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

type closeLog struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	start time.Time
}

func (l *closeLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, "+%v %s", time.Since(l.start).Round(10*time.Millisecond), p)
	return len(p), nil
}

func (l *closeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// With PostgreSQL stalled (a lock a migration or an operator holds on
// messages) a request's single statement still ends within the request
// budget (503 database_busy), so the instance's shutdown ends too. The
// statement used to wait for the lock with no deadline, holding its
// connection, and the last step of Close (the pool's) waited for it: the
// process never exited and its supervisor killed it.
func TestCloseIsBoundedWhenPostgreSQLStalls(t *testing.T) {
	vars := baseEnv()
	vars["HAN_SHUTDOWN_TIMEOUT"] = "1s"
	vars["HAN_DB_REQUEST_TIMEOUT"] = "500ms"
	lg := &closeLog{start: time.Now()}
	m := runLogged(t, vars, lg)
	_, bTok, dialogID := dialogWithSends(t, m, 1, "close-pgstall")

	// The stall: another session holds a lock on messages.
	lock := testenv.LockTable(t, env.DatabaseURL, "messages", "ACCESS EXCLUSIVE")

	// A history read arrives and waits.
	got := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("GET", m.URL()+"/v1/dialogs/"+dialogID+"/messages?afterSeq=0", nil)
		req.Header.Set("Authorization", "Bearer "+bTok)
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	select {
	case r := <-got:
		if !strings.HasPrefix(r, `503 {"error":"database_busy"}`) {
			t.Fatalf("history read while the lock was held: %s, want 503 database_busy", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("history read still waiting 5 s into the lock (request budget 500ms)")
	}

	// SIGTERM: Close.
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		t.Logf("Close returned after %v: %v", time.Since(start).Round(100*time.Millisecond), err)
	case <-time.After(15 * time.Second):
		var dump bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
		for _, g := range strings.Split(dump.String(), "\n\n") {
			if strings.Contains(g, "(*Main).Close") {
				t.Logf("Close is blocked in:\n%s", g)
			}
		}
		lock.Release()
		<-done
		t.Fatalf("Main.Close with HAN_SHUTDOWN_TIMEOUT=1s had not returned after 15 s of a PostgreSQL lock wait "+
			"(returned only once the lock was released, after %v)\nlog:\n%s",
			time.Since(start).Round(100*time.Millisecond), lg.String())
	}
}

// runLogged starts the program with vars, its log going to w.
func runLogged(t *testing.T, vars map[string]string, w io.Writer) *Main {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(w, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// dialogWithSends signs two new users in, has the first create a dialog
// with the second and send n messages into it (Idempotency-Keys key-0…),
// and returns both tokens and the dialog id.
func dialogWithSends(t *testing.T, m *Main, n int, key string) (aTok, bTok, dialogID string) {
	t.Helper()
	alice, bob := ids.New(), ids.New()
	aTok, bTok = mintToken(t, alice), mintToken(t, bob)
	for _, tk := range []string{aTok, bTok} {
		if code, body := call(t, "GET", m.URL()+"/v1/me", tk, ""); code != 200 {
			t.Fatalf("/v1/me: %d %s", code, body)
		}
	}
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	dialogID = body[strings.Index(body, `"id":"`)+6:][:36]
	for i := range n {
		if code, b := callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", aTok, fmt.Sprintf(`{"body":"m%d"}`, i),
			map[string]string{"Idempotency-Key": fmt.Sprintf("%s-%d", key, i)}); code != 201 {
			t.Fatalf("send: %d %s", code, b)
		}
	}
	return aTok, bTok, dialogID
}

// With PostgreSQL not answering at all (a partition: bytes vanish, nothing
// is refused) while sockets are open and sends are in flight, the
// instance's shutdown still ends within HAN_DRAIN_DELAY +
// HAN_SHUTDOWN_TIMEOUT (every step after the delay, the offline
// transitions' wait, the deregistration and the wait for the pools among
// them, spends what is left of that one deadline). Closing the pools
// used to wait for pgx's background close of every connection a deadline
// broke, 15 s against such a server, and the supervisor killed the
// process.
func TestCloseIsBoundedWhenPostgreSQLStopsAnswering(t *testing.T) {
	p, proxied := faultproxy.ForURL(t, env.DatabaseURL)
	vars := baseEnv()
	vars["DATABASE_URL"] = proxied
	vars["HAN_SHUTDOWN_TIMEOUT"] = "1s"
	vars["HAN_DB_REQUEST_TIMEOUT"] = "500ms"
	lg := &closeLog{start: time.Now()}
	m := runLogged(t, vars, lg)
	aTok, bTok, dialogID := dialogWithSends(t, m, 1, "close-pgdark")
	c := connectRT(t, m, bTok)
	c.subscribe(dialogID)

	p.Blackhole(true)
	var sends sync.WaitGroup
	for i := range 4 {
		sends.Go(func() {
			req, _ := http.NewRequest("POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", strings.NewReader(`{"body":"into the dark"}`))
			req.Header.Set("Authorization", "Bearer "+aTok)
			req.Header.Set("Idempotency-Key", fmt.Sprintf("close-pgdark-%d", i))
			if resp, err := (&http.Client{Timeout: time.Minute}).Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // the sends are waiting on PostgreSQL

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	bound := 1*time.Second + time.Second // HAN_DRAIN_DELAY is 0 here; a second of slack for a busy machine
	select {
	case <-done:
		t.Logf("Close returned after %v", time.Since(start).Round(100*time.Millisecond))
	case <-time.After(bound + 2*time.Second):
		p.Blackhole(false)
		<-done
		t.Fatalf("Close with PostgreSQL not answering took %v, want at most about %v\nlog:\n%s",
			time.Since(start).Round(100*time.Millisecond), bound, lg.String())
	}
	p.Blackhole(false)
	p.Cut()
	sends.Wait()
}
