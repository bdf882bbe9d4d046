package web_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/han-app/gateway/web"
)

// Users of usersAPI, each with one dialog.
const (
	aliceID        = "00000000-0000-4000-8000-00000000a11c"
	malloryID      = "00000000-0000-4000-8000-0000000bad00"
	otherMemberID  = "00000000-0000-4000-8000-000000000b0b"
	aliceDialogID  = "00000000-0000-4000-8000-0000000d1a10"
	malloryDialog  = "00000000-0000-4000-8000-0000000d1bad"
	realtimeTicket = "t-1"
)

// fakeJWT is a token shaped as a JWT whose payload names its user and
// expiry, as the client reads them (it never checks a signature; the
// server does).
func fakeJWT(user string, exp time.Time) string {
	claims, _ := json.Marshal(map[string]any{"sub": user, "exp": exp.Unix(), "jti": fmt.Sprint(exp.UnixNano())})
	return "eyJhbGciOiJIUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(claims) + ".sig"
}

// usersAPI serves the client (web.Handler) and, under /v1/, a server
// where each known bearer token is one user's (any other is 401) and each
// user sees one dialog of one message (title and body set by the test).
// Realtime tickets are refused (503), so the client reads over REST,
// unless live is set: then the ticket asked with a token opens one
// WebSocket whose hello (sent once helloGo is closed) gives that token's
// expiry; its refresh frames are answered and passed on to refreshes.
type usersAPI struct {
	title, body string
	live        bool
	// realtimeURL is the realtimeUrl of /v1/public/config (nil when not
	// set) and page the handler of the client's files (web.Handler("")
	// when not set).
	realtimeURL any
	page        http.Handler
	// skew is how far the server's clock is ahead of the browser's (behind
	// when negative): tokens expire, and hello and refreshed report
	// serverTime, on the server's clock.
	skew time.Duration

	mu        sync.Mutex
	tokens    map[string]string    // token → user id
	exps      map[string]time.Time // token → exp
	ticketFor string               // the token the last ticket was asked with
	tickets   int
	calls     []string // "<user> <path>" of each request with a known token

	upgradedOnce sync.Once
	upgraded     chan struct{} // closed when the WebSocket is open
	helloGo      chan struct{} // closed by the test: send hello
	refreshes    chan string   // the tokens of refresh frames

	// createDialog, when set, answers POST /v1/dialogs given the request's
	// Idempotency-Key (under mu).
	createDialog func(key string) (int, any)
}

func newUsersAPI(title, body string) *usersAPI {
	return &usersAPI{title: title, body: body, tokens: map[string]string{}, exps: map[string]time.Time{},
		upgraded: make(chan struct{}), helloGo: make(chan struct{}), refreshes: make(chan string, 8)}
}

// token gives a new token of user that expires in ttl.
func (a *usersAPI) token(user string, ttl time.Duration) string {
	exp := a.now().Add(ttl)
	tok := fakeJWT(user, exp)
	a.mu.Lock()
	a.tokens[tok], a.exps[tok] = user, exp
	a.mu.Unlock()
	return tok
}

// now is the server's clock.
func (a *usersAPI) now() time.Time { return time.Now().Add(a.skew) }

func (a *usersAPI) serve(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return srv
}

func (a *usersAPI) message(dialog string) map[string]any {
	return map[string]any{"id": "00000000-0000-4000-8000-000000000001", "dialogId": dialog, "seq": 1, "senderId": otherMemberID,
		"body": a.body, "createdAt": a.now().UnixMilli() - 1000, "attachments": []any{}}
}

func (a *usersAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		if a.page != nil {
			a.page.ServeHTTP(w, r)
		} else {
			web.Handler("").ServeHTTP(w, r)
		}
		return
	}
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	p := r.URL.Path
	switch p {
	case "/v1/public/config":
		reply(200, map[string]any{"realtimeUrl": a.realtimeURL})
		return
	case "/v1/realtime":
		a.realtime(w, r)
		return
	}
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	a.mu.Lock()
	me, ok := a.tokens[tok]
	if ok {
		a.calls = append(a.calls, me+" "+p)
	}
	a.mu.Unlock()
	if !ok {
		reply(401, map[string]any{"error": "unauthorized"})
		return
	}
	d := map[string]string{aliceID: aliceDialogID, malloryID: malloryDialog}[me]
	switch {
	case p == "/v1/me":
		reply(200, map[string]any{"id": me})
	case p == "/v1/realtime/tickets" && a.live:
		a.mu.Lock()
		a.ticketFor = tok
		a.tickets++
		a.mu.Unlock()
		reply(201, map[string]any{"ticket": realtimeTicket, "expiresAt": a.now().Add(30 * time.Second).UnixMilli()})
	case p == "/v1/realtime/tickets":
		reply(503, map[string]any{"error": "redis_unavailable"})
	case p == "/v1/dialogs" && r.Method == http.MethodPost && a.createDialog != nil:
		a.mu.Lock()
		code, v := a.createDialog(r.Header.Get("Idempotency-Key"))
		a.mu.Unlock()
		reply(code, v)
	case p == "/v1/dialogs":
		reply(200, map[string]any{"nextCursor": nil, "items": []any{map[string]any{
			"id": d, "title": a.title, "memberIds": []string{me, otherMemberID},
			"lastSeq": 1, "createdAt": a.now().UnixMilli() - 5000, "lastMessage": a.message(d)}}})
	case p == "/v1/dialogs/"+d+"/messages":
		reply(200, map[string]any{"items": []any{a.message(d)}, "nextCursor": nil})
	case strings.HasPrefix(p, "/v1/users/"):
		reply(200, map[string]any{"online": false, "connections": 0, "lastSeenAt": nil})
	default:
		reply(404, map[string]any{"error": "not_found"})
	}
}

// realtime is the one WebSocket of a live usersAPI: hello once the test
// says so, subscribed for every subscribe, refreshed for every refresh.
func (a *usersAPI) realtime(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	exp, ok := a.exps[a.ticketFor]
	a.mu.Unlock()
	if !ok || r.URL.Query().Get("ticket") != realtimeTicket {
		http.Error(w, "no ticket", http.StatusUnauthorized)
		return
	}
	// The page's origin, which differs when the socket has an origin of its
	// own (another port on the loopback address).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"han.v1"}, OriginPatterns: []string{"127.0.0.1:*"}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	a.upgradedOnce.Do(func() { close(a.upgraded) })
	ctx := r.Context()
	select {
	case <-a.helloGo:
	case <-ctx.Done():
		return
	}
	_ = wsjson.Write(ctx, c, map[string]any{"type": "hello", "connectionId": "00000000-0000-4000-8000-00000000c0c0",
		"instance": "fake", "heartbeatMs": 60000, "expiresAt": exp.UnixMilli(),
		"serverTime": a.now().UnixMilli()})
	for {
		var f struct{ Type, DialogID, Token string }
		if err := wsjson.Read(ctx, c, &f); err != nil {
			return
		}
		switch f.Type {
		case "subscribe":
			_ = wsjson.Write(ctx, c, map[string]any{"type": "subscribed", "dialogId": f.DialogID, "lastSeq": 1})
		case "ping":
			_ = wsjson.Write(ctx, c, map[string]any{"type": "pong"})
		case "refresh":
			a.mu.Lock()
			newExp := a.exps[f.Token]
			a.mu.Unlock()
			a.refreshes <- f.Token
			_ = wsjson.Write(ctx, c, map[string]any{"type": "refreshed", "expiresAt": newExp.UnixMilli(), "serverTime": a.now().UnixMilli()})
		}
	}
}

// signInTab opens a sign-in link with tok in the tab and the user's
// dialog, and waits for its message.
func signInTab(t *testing.T, ctx context.Context, base, tok, dialog string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(base+"/#token="+tok)); err != nil {
		t.Fatalf("open: %v", err)
	}
	confirmLinkSignIn(t, ctx)
	waitJS(t, ctx, 10*time.Second, "the dialog list", fmt.Sprintf("document.querySelector('[data-dialog=%q]')", dialog))
	evalJS[bool](t, ctx, fmt.Sprintf("(location.hash = %q, true)", "#/chat/"+dialog))
	waitJS(t, ctx, 10*time.Second, "the messages", "document.querySelector('#messages li.msg .body')")
}

// signedInAs is the user the tab shows as signed in, or "(signed out)".
func signedInAs(t *testing.T, ctx context.Context) string {
	t.Helper()
	return evalJS[string](t, ctx, `(!document.querySelector('#me').hidden && !document.querySelector('#signin-form') &&
		document.querySelector('#me-id').title) || "(signed out)"`)
}

// confirmLinkSignIn answers Sign in to the question a sign-in link opened
// in a signed-out tab asks.
func confirmLinkSignIn(t *testing.T, ctx context.Context) {
	t.Helper()
	waitJS(t, ctx, 10*time.Second, "the sign-in question", `document.querySelector('#link-signin-go')`)
	click(t, ctx, "#link-signin-go")
}

// callsOf are the paths the server was asked for with user's tokens.
func (a *usersAPI) callsOf(user string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var paths []string
	for _, c := range a.calls {
		if u, p, _ := strings.Cut(c, " "); u == user {
			paths = append(paths, p)
		}
	}
	return paths
}
