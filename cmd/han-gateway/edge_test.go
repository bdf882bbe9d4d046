package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

func userToken(t *testing.T, sub string) string {
	t.Helper()
	s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clientFrom is an HTTP client whose every request is a new connection
// from the loopback address src.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: apiCheck.Transport(&http.Transport{DialContext: d.DialContext, DisableKeepAlives: true})}
}

func do(t *testing.T, c *http.Client, method, url, tok, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// dialogOf creates a dialog of a and b (both seen first) through c.
func dialogOf(t *testing.T, c *http.Client, base, aTok, bTok, b string) string {
	t.Helper()
	if resp, body := do(t, c, "GET", base+"/v1/me", bTok, "", nil); resp.StatusCode != 200 {
		t.Fatalf("me: %d %s", resp.StatusCode, body)
	}
	resp, body := do(t, c, "POST", base+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q]}`, b), nil)
	if resp.StatusCode != 201 {
		t.Fatalf("create dialog: %d %s", resp.StatusCode, body)
	}
	return body[strings.Index(body, `"id":"`)+6:][:36]
}

func rawDial(t *testing.T, src, addr string, control func(network, address string, c syscall.RawConn) error) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second, Control: control}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Slow bodies hold nothing: attackers from one address beyond the per-peer
// cap get the canned 503, the ones let in are answered and closed within
// their body deadline (unauthenticated: at once, without reading the body;
// authenticated: 408 once the deadline passes), and a client from another
// address is served throughout, each request on a new connection.
func TestSlowBodiesAreCappedAndCutOffWhileOthersAreServed(t *testing.T) {
	const perIP = 10
	vars := baseEnv()
	vars["HAN_MAX_CONNS_PER_IP"] = strconv.Itoa(perIP)
	vars["HAN_MAX_CONNECTIONS"] = "60"
	vars["HAN_HTTP_BODY_TIMEOUT"] = "2s"
	m := start(t, vars)
	good := clientFrom("127.0.0.2")
	alice, bob, carol := ids.New(), ids.New(), ids.New()
	aTok, bTok, cTok := userToken(t, alice), userToken(t, bob), userToken(t, carol)
	dialog := dialogOf(t, good, m.URL(), aTok, bTok, bob)
	carolDialog := dialogOf(t, good, m.URL(), cTok, aTok, alice)

	// 2× the per-peer cap of slow-body attackers from 127.0.0.1. The first
	// half connect and stay silent until the server counts them (the scrape
	// is one more connection); the second half send their request at once
	// and must read the canned 503, not a reset.
	anonHead := "POST /v1/dialogs HTTP/1.1\r\nHost: " + m.Addr() + "\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
	var admitted []net.Conn
	for range perIP {
		admitted = append(admitted, rawDial(t, "127.0.0.1", m.Addr(), nil))
	}
	testenv.Eventually(t, 8*time.Second, func() bool { return openConnections(t, good, m.URL()) == perIP+1 },
		"the first %d attackers are not counted", perIP)
	for i := range perIP {
		c := rawDial(t, "127.0.0.1", m.Addr(), nil)
		_, _ = io.WriteString(c, anonHead)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("attacker %d over the per-peer cap: %v, want the canned 503", perIP+i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(b) != `{"error":"overloaded"}` || resp.Header.Get("Retry-After") == "" || !resp.Close {
			t.Fatalf("over the cap: %d %q %v", resp.StatusCode, b, resp.Header)
		}
	}

	type outcome struct {
		who    string
		status int
		body   string
		closed bool
	}
	results := make(chan outcome, 2*perIP)
	var wg sync.WaitGroup
	slow := func(who string, c net.Conn, head string, declared int) {
		defer wg.Done()
		stop := make(chan struct{})
		go func() { // one body byte per second until the server gives up
			if _, err := io.WriteString(c, head); err != nil {
				return
			}
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for range declared {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
		defer close(stop)
		// Body deadline: 2 s + the declared length at 64 KiB/s (< 2 s);
		// the bound below only separates "cut off" from "held open".
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			results <- outcome{who: who}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		results <- outcome{who: who, status: resp.StatusCode, body: string(b), closed: resp.Close && testenv.PeerCloses(c, br, 20*time.Second)}
	}
	for _, c := range admitted {
		wg.Add(1)
		go slow("anonymous", c, anonHead, 100000)
	}
	for range 3 {
		wg.Add(1)
		head := "POST /v1/dialogs/" + carolDialog + "/messages HTTP/1.1\r\nHost: " + m.Addr() + "\r\nAuthorization: Bearer " + cTok +
			"\r\nIdempotency-Key: " + ids.New() + "\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{"
		go slow("authenticated", rawDial(t, "127.0.0.3", m.Addr(), nil), head, 60000)
	}

	// Meanwhile: 50 sends from 127.0.0.2, each on a new connection (two
	// senders keep under the per-user send limit).
	for i := range 50 {
		tok := aTok
		if i%2 == 1 {
			tok = bTok
		}
		resp, body := do(t, good, "POST", m.URL()+"/v1/dialogs/"+dialog+"/messages", tok, fmt.Sprintf(`{"body":"good %d"}`, i),
			map[string]string{"Idempotency-Key": ids.New(), "Content-Type": "application/json"})
		if resp.StatusCode != 201 {
			t.Fatalf("good send %d during the attack: %d %s", i, resp.StatusCode, body)
		}
	}

	wg.Wait()
	close(results)
	for o := range results {
		want := outcome{who: o.who, status: 401, body: `{"error":"unauthorized"}`, closed: true}
		if o.who == "authenticated" {
			want.status, want.body = 408, `{"error":"request_timeout"}`
		}
		if o != want {
			t.Errorf("slow body: got %+v, want %+v", o, want)
		}
	}
}

// openConnections reads han_http_connections_open from /metrics (the
// scrape's own connection included).
func openConnections(t *testing.T, c *http.Client, base string) int {
	t.Helper()
	_, body := do(t, c, "GET", base+"/metrics", "", "", nil)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "han_http_connections_open "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("/metrics has no han_http_connections_open")
	return 0
}

// A client that asks for a large history page and never reads it is
// disconnected by the response write deadline instead of holding its
// descriptor.
func TestHistoryPageNotReadIsCutOffByTheWriteDeadline(t *testing.T) {
	vars := baseEnv()
	vars["HAN_HTTP_BODY_TIMEOUT"] = "1s"
	m := start(t, vars)
	good := clientFrom("127.0.0.2")
	alice, bob := ids.New(), ids.New()
	aTok, bTok := userToken(t, alice), userToken(t, bob)
	dialog := dialogOf(t, good, m.URL(), aTok, bTok, bob)
	// 100 messages of 4000 '<', each escaped to 6 bytes in JSON: ≈ 2.4 MB.
	st := store.New(m.pg)
	long := strings.Repeat("<", 4000)
	for range 100 {
		if _, _, _, err := st.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: dialog, SenderID: alice, Body: long}); err != nil {
			t.Fatal(err)
		}
	}
	smallWindow := func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}
	c := rawDial(t, "127.0.0.4", m.Addr(), smallWindow)
	// Loopback socket buffers can absorb one whole page (the kernel sizes a
	// sender's buffer up to 4 MiB), so the client asks for the page several
	// times in one go (pipelined) and reads none of the answers.
	const pipelined = 6
	req := "GET /v1/dialogs/" + dialog + "/messages?afterSeq=0&limit=100 HTTP/1.1\r\nHost: " + m.Addr() +
		"\r\nAuthorization: Bearer " + aTok + "\r\n\r\n"
	if _, err := io.WriteString(c, strings.Repeat(req, pipelined)); err != nil {
		t.Fatal(err)
	}
	// The stalled connection is released by the server (only the scrape's
	// own connection stays counted).
	testenv.Eventually(t, 90*time.Second, func() bool { return openConnections(t, good, m.URL()) == 1 },
		"the server still holds the connection of a client that reads nothing")
	// What reaches the client is cut off before the last page.
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	complete := 0
	for ; complete < pipelined; complete++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || n != resp.ContentLength {
			break
		}
	}
	if complete == pipelined {
		t.Fatalf("all %d pages arrived: the server waited for the client", pipelined)
	}
}

// An unauthenticated request with a large declared body is answered 401
// and closed; the server reads none of the body (it never arrives here).
func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	vars := baseEnv()
	vars["HAN_HTTP_BODY_TIMEOUT"] = "60s"
	m := start(t, vars)
	c := rawDial(t, "127.0.0.1", m.Addr(), nil)
	if _, err := io.WriteString(c, "POST /v1/dialogs HTTP/1.1\r\nHost: "+m.Addr()+
		"\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{\"memberIds\""); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer while the body is missing: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || string(b) != `{"error":"unauthorized"}` || !resp.Close {
		t.Fatalf("answer: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	if !testenv.PeerCloses(c, br, 20*time.Second) {
		t.Fatal("the connection stays open after the 401")
	}
}

// rateLimitRemaining is r= of the ip family in the RateLimit field.
func rateLimitRemaining(t *testing.T, resp *http.Response) int {
	t.Helper()
	for _, item := range strings.Split(resp.Header.Get("RateLimit"), ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(item), `"ip";r=`); ok {
			n, _ := strconv.Atoi(v[:strings.IndexByte(v, ';')])
			return n
		}
	}
	t.Fatalf("no ip family in RateLimit: %q", resp.Header.Get("RateLimit"))
	return 0
}

func randomIP() string {
	return fmt.Sprintf("198.18.%d.%d", rand.IntN(256), 1+rand.IntN(254))
}

// Forwarding headers name the client only when the peer is a trusted proxy:
// the rate-limit family "ip" counts the peer otherwise, and the forwarded
// client (the right-most untrusted hop) with HAN_TRUSTED_PROXIES.
// /v1/public/config never reflects a foreign Host.
func TestForwardedHeadersOnlyFromTrustedProxies(t *testing.T) {
	cfgURL := func(m *Main) string { return m.URL() + "/v1/public/config" }
	c := clientFrom("127.0.0.5")
	t.Run("untrusted peer", func(t *testing.T) {
		m := start(t, baseEnv())
		// Two requests claiming two different clients share the peer's
		// quota; retried if a fixed window turned in between.
		for try := 0; ; try++ {
			r1, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": randomIP()})
			r2, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"Forwarded": "for=" + randomIP()})
			if rateLimitRemaining(t, r2) == rateLimitRemaining(t, r1)-1 {
				break
			}
			if try == 3 {
				t.Fatalf("forwarded clients from an untrusted peer got their own quotas: %q then %q", r1.Header.Get("RateLimit"), r2.Header.Get("RateLimit"))
			}
		}
		resp, body := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"Host": "evil.example", "X-Forwarded-Proto": "https"})
		if resp.StatusCode != 200 || strings.Contains(body, "evil") || !strings.Contains(body, `"realtimeUrl":null`) || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("foreign Host: %d %s %v", resp.StatusCode, body, resp.Header)
		}
		_, body = do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-Proto": "https"})
		if !strings.Contains(body, `"realtimeUrl":"ws://`+m.Addr()+`/v1/realtime"`) {
			t.Fatalf("loopback Host, untrusted X-Forwarded-Proto: %s", body)
		}
	})
	t.Run("trusted proxy", func(t *testing.T) {
		vars := baseEnv()
		vars["HAN_TRUSTED_PROXIES"] = "127.0.0.0/8"
		m := start(t, vars)
		// A client cannot choose its address: what it puts left of the
		// proxy's entry is skipped, and the same client is counted again
		// (retried if a fixed window turned in between).
		for try := 0; ; try++ {
			client := randomIP()
			r1, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": client})
			r2, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": randomIP() + ", " + client + ", 127.0.0.9"})
			if rateLimitRemaining(t, r2) == rateLimitRemaining(t, r1)-1 {
				break
			}
			if try == 3 {
				t.Fatalf("same forwarded client not counted together: %q then %q", r1.Header.Get("RateLimit"), r2.Header.Get("RateLimit"))
			}
		}
		// A different forwarded client has its own quota.
		r, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": randomIP()})
		if got := rateLimitRemaining(t, r); got != 299 {
			t.Fatalf("new forwarded client: remaining %d, want a fresh quota of 300 - 1", got)
		}
		// The proxy writes X-Forwarded-For (the default), so a Forwarded
		// header came from the client: it changes nothing.
		for try := 0; ; try++ {
			client := randomIP()
			r1, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": client})
			r2, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-For": client, "Forwarded": "for=" + randomIP()})
			if rateLimitRemaining(t, r2) == rateLimitRemaining(t, r1)-1 {
				break
			}
			if try == 3 {
				t.Fatalf("a client's own Forwarded header got it another quota: %q then %q", r1.Header.Get("RateLimit"), r2.Header.Get("RateLimit"))
			}
		}
		resp, body := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"Host": "evil.example", "X-Forwarded-Proto": "https"})
		if strings.Contains(body, "evil") || !strings.Contains(body, `"realtimeUrl":null`) || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("foreign Host through a proxy: %s", body)
		}
		_, body = do(t, c, "GET", cfgURL(m), "", "", map[string]string{"X-Forwarded-Proto": "https"})
		if !strings.Contains(body, `"realtimeUrl":"wss://`+m.Addr()+`/v1/realtime"`) {
			t.Fatalf("X-Forwarded-Proto from a trusted proxy: %s", body)
		}
	})
	t.Run("trusted proxy writing Forwarded", func(t *testing.T) {
		vars := baseEnv()
		vars["HAN_TRUSTED_PROXIES"], vars["HAN_FORWARDED_HEADER"] = "127.0.0.0/8", "forwarded"
		m := start(t, vars)
		r, _ := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"Forwarded": `for="` + randomIP() + `:4711";proto=https`})
		if got := rateLimitRemaining(t, r); got != 299 {
			t.Fatalf("new client behind a Forwarded proxy: remaining %d, want a fresh quota of 300 - 1", got)
		}
		_, body := do(t, c, "GET", cfgURL(m), "", "", map[string]string{"Forwarded": "proto=https", "X-Forwarded-Proto": "http"})
		if !strings.Contains(body, `"realtimeUrl":"wss://`+m.Addr()+`/v1/realtime"`) {
			t.Fatalf("Forwarded proto=https from a trusted proxy: %s", body)
		}
	})
	t.Run("prod needs a public realtime URL", func(t *testing.T) {
		vars := baseEnv()
		delete(vars, "HAN_JWT_DEV_HS256_SECRET")
		vars["HAN_ENV"], vars["HAN_JWKS_FILE"] = "prod", "/nonexistent/jwks.json"
		err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] })
		if err == nil || !strings.Contains(err.Error(), "HAN_PUBLIC_REALTIME_URL") {
			t.Fatalf("prod without HAN_PUBLIC_REALTIME_URL: %v", err)
		}
	})
}

// A WebSocket outlives the HTTP deadlines: the hijacked connection keeps
// no read or write deadline from its upgrade request.
func TestWebSocketOutlivesHTTPDeadlines(t *testing.T) {
	vars := baseEnv()
	vars["HAN_HTTP_BODY_TIMEOUT"] = "1s"
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	aTok, bTok := userToken(t, alice), userToken(t, bob)
	dialog := dialogOf(t, clientFrom("127.0.0.2"), m.URL(), aTok, bTok, bob)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+m.Addr()+"/v1/realtime", &websocket.DialOptions{
		Subprotocols: []string{"han.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + aTok}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"type":"hello"`) {
		t.Fatalf("hello: %s %v", b, err)
	}
	time.Sleep(3 * time.Second) // past both deadlines of the upgrade request
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+dialog+`"}`)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"type":"subscribed"`) {
		t.Fatalf("after the HTTP deadlines: %s %v", b, err)
	}
}

// net/http answers a header over 64 KiB itself (431, plain text).
func TestHeaderOver64KiBIsRefused(t *testing.T) {
	m := start(t, baseEnv())
	resp, _ := do(t, clientFrom("127.0.0.2"), "GET", m.URL()+"/healthz", "", "", map[string]string{"X-Big": strings.Repeat("a", 80<<10)})
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("80 KiB header: %d", resp.StatusCode)
	}
	resp, _ = do(t, clientFrom("127.0.0.2"), "GET", m.URL()+"/healthz", "", "", map[string]string{"X-Big": strings.Repeat("a", 32<<10)})
	if resp.StatusCode != 200 {
		t.Fatalf("32 KiB header: %d", resp.StatusCode)
	}
}

// A reverse proxy on the same machine is a loopback peer: the debug
// endpoints serve only when the client it forwards is on loopback too.
func TestDebugEndpointsRefuseClientsForwardedByALocalProxy(t *testing.T) {
	vars := baseEnv()
	vars[debugEnv] = "1"
	vars["HAN_TRUSTED_PROXIES"] = "127.0.0.1"
	m := start(t, vars)
	c := clientFrom("127.0.0.1")
	if resp, body := do(t, c, "GET", m.URL()+"/debug/pprof/", "", "", map[string]string{"X-Forwarded-For": "192.0.2.7"}); resp.StatusCode != 404 {
		t.Fatalf("remote client through the local proxy: %d %.80s", resp.StatusCode, body)
	}
	if resp, _ := do(t, c, "GET", m.URL()+"/debug/pprof/", "", "", map[string]string{"X-Forwarded-For": "127.0.0.1"}); resp.StatusCode != 200 {
		t.Fatalf("loopback client through the local proxy: %d", resp.StatusCode)
	}
}
