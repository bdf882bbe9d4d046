package gateway_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// mint signs a token of kind for sub that expires ttl from now and returns
// it with its exp (whole seconds, as the token carries it).
func mint(t testing.TB, sub string, kind auth.Kind, ttl time.Duration) (string, time.Time) {
	t.Helper()
	tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: sub, Kind: kind, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	var c jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(tok, &c); err != nil {
		t.Fatal(err)
	}
	return tok, c.ExpiresAt.Time
}

// wantExpired waits for the server to close c with 4001 token_expired and
// checks it did not do so before deadline (exp + leeway).
func wantExpired(t testing.TB, c *client, deadline time.Time) {
	t.Helper()
	code, reason := c.closeStatus(time.Until(deadline) + 20*time.Second)
	if code != gateway.CloseUnauthorized || reason != gateway.CloseReasonTokenExpired {
		t.Fatalf("close %d %q, want %d %q", code, reason, gateway.CloseUnauthorized, gateway.CloseReasonTokenExpired)
	}
	if c.endedAt.Before(deadline) {
		t.Fatalf("closed at %v, %v before the deadline exp + leeway", c.endedAt, deadline.Sub(c.endedAt))
	}
}

// ping proves the connection is open and handling frames.
func (c *client) ping() {
	c.t.Helper()
	c.send(`{"type":"ping"}`)
	c.expect("pong")
}

func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// A socket lives exactly as long as its bearer token is accepted by the
// verifier the REST API authenticates with: open past exp while within the
// verifier's leeway, closed with 4001 token_expired once exp + leeway
// passed, and by then the verifier refuses the same token (REST answers
// it with 401).
func TestTokenExpiryClosesSocket(t *testing.T) {
	const leeway = 3 * time.Second
	pool := openPool(t)
	in := newInstance(t, pool, opts{leeway: leeway})
	u := in.users(1)[0]
	tok, exp := mint(t, u, auth.KindUser, 2*time.Second)
	c := in.connectWith(dialOpts{token: tok})
	if hello := c.expect("hello"); hello.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("hello expiresAt %d, want the token's exp %d", hello.ExpiresAt, exp.UnixMilli())
	}

	sleepUntil(exp.Add(100 * time.Millisecond))
	c.ping() // exp passed, the leeway has not
	if _, err := in.verifier.Verify(context.Background(), tok); err != nil {
		t.Fatalf("the token is refused within the leeway: %v", err)
	}

	wantExpired(t, c, exp.Add(leeway))
	if _, err := in.verifier.Verify(context.Background(), tok); err == nil {
		t.Fatal("the token is still accepted after exp + leeway")
	}
	if n := in.svc.Stats().Closes[int(gateway.CloseUnauthorized)]; n != 1 {
		t.Fatalf("4001 closes counted: %d", n)
	}
}

// A refresh frame with a new token of the same user moves the expiry: the
// socket outlives the first token and closes when the second one expires.
func TestRefreshMovesExpiry(t *testing.T) {
	const leeway = time.Second
	pool := openPool(t)
	in := newInstance(t, pool, opts{leeway: leeway})
	u := in.users(1)[0]
	tok1, exp1 := mint(t, u, auth.KindUser, 2*time.Second)
	c := in.connectWith(dialOpts{token: tok1})
	c.expect("hello")

	tok2, exp2 := mint(t, u, auth.KindUser, 7*time.Second)
	c.send(`{"type":"refresh","token":"` + tok2 + `"}`)
	if f := c.expect("refreshed"); f.ExpiresAt != exp2.UnixMilli() ||
		string(f.raw) != `{"type":"refreshed","expiresAt":`+strconv.FormatInt(exp2.UnixMilli(), 10)+`,"serverTime":`+strconv.FormatInt(f.ServerTime, 10)+`}` {
		t.Fatalf("refreshed frame %s, want expiresAt %d", f.raw, exp2.UnixMilli())
	}

	// Well past the first token's deadline (the server checks every second).
	sleepUntil(exp1.Add(leeway + 2*time.Second))
	c.ping()
	wantExpired(t, c, exp2.Add(leeway))
}

// A refresh that proves nothing changes nothing; one that proves another
// identity ends the connection.
func TestRefreshRefusals(t *testing.T) {
	const leeway = time.Second
	pool := openPool(t)
	in := newInstance(t, pool, opts{leeway: leeway, hub: func(c *gateway.Config) { c.FrameRate, c.FrameBurst = 1, 4 }})
	users := in.users(2)
	u, other := users[0], users[1]

	t.Run("invalid token: error frame, old expiry kept", func(t *testing.T) {
		tok, exp := mint(t, u, auth.KindUser, 3*time.Second)
		c := in.connectWith(dialOpts{token: tok})
		c.expect("hello")
		expired, _ := mint(t, u, auth.KindUser, -time.Hour)
		foreign, err := auth.MintDevToken([]byte("another-secret-0123456789abcdefghij"), auth.DevClaims{Subject: u, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"not-a-jwt", expired, foreign} {
			c.send(`{"type":"refresh","token":"` + bad + `"}`)
			if f := c.expect("error"); f.Error != "unauthorized" || string(f.raw) != `{"type":"error","error":"unauthorized"}` {
				t.Fatalf("refresh with a bad token answered %s", f.raw)
			}
		}
		wantExpired(t, c, exp.Add(leeway))
	})
	t.Run("another user's token: 4003", func(t *testing.T) {
		c := in.connect(u)
		tok, _ := mint(t, other, auth.KindUser, time.Hour)
		c.send(`{"type":"refresh","token":"` + tok + `"}`)
		if code, reason := c.closeStatus(10 * time.Second); code != gateway.CloseForbidden || reason != gateway.CloseReasonUserMismatch {
			t.Fatalf("close %d %q, want 4003 %q", code, reason, gateway.CloseReasonUserMismatch)
		}
	})
	t.Run("service token: 4003", func(t *testing.T) {
		c := in.connect(u)
		tok, _ := mint(t, u, auth.KindService, time.Hour)
		c.send(`{"type":"refresh","token":"` + tok + `"}`)
		if code, reason := c.closeStatus(10 * time.Second); code != gateway.CloseForbidden || reason != gateway.CloseReasonUserSession {
			t.Fatalf("close %d %q, want 4003 %q", code, reason, gateway.CloseReasonUserSession)
		}
	})
	t.Run("refresh frames count against the frame rate", func(t *testing.T) {
		c := in.connect(u)
		tok, _ := mint(t, u, auth.KindUser, time.Hour)
		for range 8 { // burst 4, 1 frame/s
			if err := c.ws.Write(context.Background(), websocket.MessageText, []byte(`{"type":"refresh","token":"`+tok+`"}`)); err != nil {
				break
			}
		}
		if code, _ := c.closeStatus(10 * time.Second); code != gateway.ClosePolicy {
			t.Fatalf("close %d, want 1008 for the frame rate", code)
		}
	})
}

// A socket opened with a ticket inherits the exp of the token that asked
// for the ticket (the ticket endpoint passes the verified token's exp to
// IssueTicket); a ticket redeemed after that token expired opens nothing.
func TestTicketSocketInheritsTokenExpiry(t *testing.T) {
	const leeway = time.Second
	pool := openPool(t)
	in := newInstance(t, pool, opts{leeway: leeway})
	u := in.users(1)[0]
	issue := func(tok string) string {
		t.Helper()
		ctx := context.Background()
		p, err := in.verifier.Verify(ctx, tok)
		if err != nil {
			t.Fatalf("ticket: %v", err)
		}
		tk, _, err := in.svc.IssueTicket(ctx, p.UserID, p.Expires)
		if err != nil {
			t.Fatalf("ticket: %v", err)
		}
		return tk
	}

	tok, exp := mint(t, u, auth.KindUser, 3*time.Second)
	c := in.connectWith(dialOpts{ticket: issue(tok), origin: testOrigin})
	if hello := c.expect("hello"); hello.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("hello expiresAt %d, want the issuing token's exp %d", hello.ExpiresAt, exp.UnixMilli())
	}
	wantExpired(t, c, exp.Add(leeway))

	tok, exp = mint(t, u, auth.KindUser, time.Second)
	tk := issue(tok)
	sleepUntil(exp.Add(leeway + 100*time.Millisecond)) // the ticket itself lives 30 s
	late := in.connectWith(dialOpts{ticket: tk, origin: testOrigin})
	if code, reason := late.closeStatus(10 * time.Second); code != gateway.CloseUnauthorized || reason != gateway.CloseReasonTokenExpired {
		t.Fatalf("late ticket: close %d %q, want 4001 %q", code, reason, gateway.CloseReasonTokenExpired)
	}
}

// Thousands of sockets expire without a goroutine or timer each: while they
// are open the process holds about two goroutines per connection (the
// server's reader and this test's client reader, as in
// TestIdleConnectionHoldsOneGoroutine), and all of them close with 4001
// token_expired. They connect with a long token and are then refreshed to
// a short one, so a slow connect phase cannot eat into the short one.
func TestThousandsOfSocketsExpire(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2000 sockets")
	}
	const (
		n       = 2000
		nUsers  = 20
		leeway  = time.Second
		workers = 16
	)
	pool := openPool(t)
	in := newInstance(t, pool, opts{leeway: leeway, presence: func(c *presence.Config) { c.MaxConnsPerUser = n },
		hub: func(c *gateway.Config) { c.UserHandshakeBurst = n }})
	users := in.users(nUsers)
	settle := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	base := settle()

	clients := make([]*client, n)
	parallel(n, workers, func(i int) {
		tok, _ := mint(t, users[i%nUsers], auth.KindUser, time.Hour)
		c := in.connectWith(dialOpts{token: tok})
		c.expect("hello")
		clients[i] = c
	})
	var got int
	testenv.Eventually(t, 30*time.Second, func() bool {
		got = settle() - base
		return got <= 2*n+n/4
	}, "goroutines for %d open connections: %d", n, got)
	t.Logf("%d open connections: %d goroutines (server and client side)", n, got)

	var mu sync.Mutex
	deadline := time.Time{}
	parallel(n, workers, func(i int) {
		exp := refreshShort(t, clients[i], users[i%nUsers], leeway)
		mu.Lock()
		if exp.Add(leeway).After(deadline) {
			deadline = exp.Add(leeway)
		}
		mu.Unlock()
	})
	for i, c := range clients {
		code, reason := c.closeStatus(time.Until(deadline) + 60*time.Second)
		if code != gateway.CloseUnauthorized || reason != gateway.CloseReasonTokenExpired {
			t.Fatalf("client %d: close %d %q, want 4001 token_expired", i, code, reason)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return in.svc.Stats().Connections == 0 },
		"connections left on the server: %d", in.svc.Stats().Connections)
	testenv.Eventually(t, 30*time.Second, func() bool {
		got = settle() - base
		return got <= n/20
	}, "goroutines after every connection expired: %d more than before", got)
}

// refreshShort refreshes c to a token of two seconds and returns its exp.
// Each refresh is a round trip of its own: sent all at once, 2,000 of them
// queue for the server's verification, and on a busy machine the last ones
// were verified after their two seconds (and the leeway) had passed, which
// the server rightly refuses. A refusal that came after the token's
// deadline is retried with a new token; one before it fails the test.
func refreshShort(t *testing.T, c *client, user string, leeway time.Duration) time.Time {
	t.Helper()
	for attempt := 1; ; attempt++ {
		tok, exp := mint(t, user, auth.KindUser, 2*time.Second)
		c.send(`{"type":"refresh","token":"` + tok + `"}`)
		f := c.next(10 * time.Second)
		for f.Type == "event" && (f.Event == gateway.EventPresenceChanged || f.Event == gateway.EventTyping) {
			f = c.next(10 * time.Second)
		}
		switch {
		case f.Type == "refreshed" && f.ExpiresAt == exp.UnixMilli():
			return exp
		case f.Type == "error" && f.Error == "unauthorized" && attempt < 3 && time.Now().After(exp.Add(leeway)):
			continue // verified after its deadline: expired, as it should be
		}
		t.Fatalf("refresh %d: want a refreshed frame with expiresAt %d, got %s", attempt, exp.UnixMilli(), f.raw)
	}
}

// parallel runs f(0..n-1) on workers goroutines. The indexes are queued
// up front, so a worker that ends early (a failed check) blocks nothing.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// A token whose exp lies past 2262 (9999999999 is a common "never") keeps
// its socket open as REST keeps answering it: its expiry is held in Unix
// nanoseconds, which wrapped to the past and closed the socket with 4001
// token_expired at the next check — on connect and on refresh alike.
func TestTokenExpiringAfter2262KeepsTheSocketOpen(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(1)[0]
	far := time.Until(time.Unix(9999999999, 0))
	tok, exp := mint(t, u, auth.KindUser, far)
	if exp.Year() < 2262 {
		t.Fatalf("the token expires in %d, want after 2262", exp.Year())
	}
	direct := in.connectWith(dialOpts{token: tok})
	if hello := direct.expect("hello"); hello.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("hello expiresAt %d, want %d", hello.ExpiresAt, exp.UnixMilli())
	}
	refreshed := in.connect(u)
	refreshed.send(`{"type":"refresh","token":"` + tok + `"}`)
	if f := refreshed.expect("refreshed"); f.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("refreshed expiresAt %d, want %d", f.ExpiresAt, exp.UnixMilli())
	}
	time.Sleep(2500 * time.Millisecond) // the server checks expiries every second
	direct.ping()
	refreshed.ping()
}
