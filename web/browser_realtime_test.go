package web_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/web"
)

// elsewhere is a server of another origin that counts what reaches it.
func elsewhere(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "no", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// ticketsAsked is how many realtime tickets the client has asked for.
func (a *usersAPI) ticketsAsked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tickets
}

// The page's Content-Security-Policy lets it open WebSockets only to its
// own origin and to the one the deployment names (HAN_PUBLIC_REALTIME_URL).
// A realtimeUrl of any other origin (a /v1/public/config answer the
// deployment never gave, or a script injected into the page) gets no
// connection: its ticket, and the tokens a live connection sends in band,
// never leave for a host the deployment does not run.
func TestThePageOpensNoSocketToAnOriginTheDeploymentDidNotName(t *testing.T) {
	ctx := startChromium(t)
	other, hits := elsewhere(t)
	a := newUsersAPI("Plans", "hello")
	a.live = true
	a.realtimeURL = "ws://" + other.Listener.Addr().String() + "/v1/realtime"
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	// Two connection attempts, each with a ticket of its own.
	deadline := time.Now().Add(20 * time.Second)
	for a.ticketsAsked() < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := a.ticketsAsked(); n < 2 {
		t.Fatalf("the client asked for %d tickets in 20 s, want a second attempt", n)
	}
	time.Sleep(300 * time.Millisecond) // the second attempt's upgrade, had one been allowed
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests (WebSocket upgrades carrying a ticket) reached %s, an origin the deployment did not name", n, other.URL)
	}
	// A page script cannot open one either.
	blocked := evalJS[bool](t, ctx, `new Promise((resolve) => {
		document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective === "connect-src"), { once: true });
		try { new WebSocket(`+jsString("ws://"+other.Listener.Addr().String()+"/x")+`); } catch { resolve(true); }
		setTimeout(() => resolve(false), 3000);
	})`)
	if !blocked || hits.Load() != 0 {
		t.Errorf("a page script opened a WebSocket to %s (blocked by the CSP: %v, requests there: %d)", other.URL, blocked, hits.Load())
	}
}

// A deployment whose WebSocket endpoint has an origin of its own
// (HAN_PUBLIC_REALTIME_URL) still connects there: the page's CSP names it.
func TestThePageConnectsToTheRealtimeOriginTheDeploymentNamed(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Plans", "hello")
	a.live = true
	rt := httptest.NewServer(http.HandlerFunc(a.realtime))
	t.Cleanup(rt.Close)
	a.realtimeURL = "ws://" + rt.Listener.Addr().String() + "/v1/realtime"
	a.page = web.Handler(a.realtimeURL.(string))
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	select {
	case <-a.upgraded:
	case <-time.After(15 * time.Second):
		t.Fatalf("no WebSocket reached the configured realtime origin %s", rt.URL)
	}
	close(a.helloGo)
	waitJS(t, ctx, 10*time.Second, "the banner to say Live", `document.querySelector('#conn').dataset.phase === "live"`)
}

// A realtimeUrl that is not a ws: or wss: URL (a broken proxy's answer: a
// number, javascript:, http:) or a plain ws: URL for a page served over
// https (the browser blocks it as mixed content, and tokens go over the
// socket in band) is not used: the client connects to its own origin's
// /v1/realtime, which the gateway serving the page always answers,
// instead of failing every attempt for as long as the tab is open.
func TestARealtimeURLThatCannotBeUsedFallsBackToThisOrigin(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Plans", "hello")
	a.live = true
	a.realtimeURL = "javascript:document.title='pwned'"
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	select {
	case <-a.upgraded:
	case <-time.After(15 * time.Second):
		t.Fatalf("realtimeUrl %q: the client never connected to its own origin", a.realtimeURL)
	}
	close(a.helloGo)
	waitJS(t, ctx, 10*time.Second, "the banner to say Live", `document.querySelector('#conn').dataset.phase === "live"`)

	got := evalJS[string](t, ctx, `import("/js/api.js").then(({ realtimeURL }) => JSON.stringify([
		realtimeURL(5, "https://chat.example"),
		realtimeURL(null, "https://chat.example"),
		realtimeURL("javascript:alert(1)", "https://chat.example"),
		realtimeURL("https://rt.example/v1/realtime", "https://chat.example"),
		realtimeURL("ws://rt.example/v1/realtime", "https://chat.example"),
		realtimeURL("ws://user:pw@rt.example/v1/realtime", "http://chat.example"),
		realtimeURL("wss://rt.example/v1/realtime", "https://chat.example"),
		realtimeURL("ws://rt.example:8080/v1/realtime", "http://chat.example"),
		realtimeURL(null, "http://localhost:8080"),
	]))`)
	want := `["wss://chat.example/v1/realtime","wss://chat.example/v1/realtime","wss://chat.example/v1/realtime",` +
		`"wss://chat.example/v1/realtime","wss://chat.example/v1/realtime","ws://chat.example/v1/realtime",` +
		`"wss://rt.example/v1/realtime","ws://rt.example:8080/v1/realtime","ws://localhost:8080/v1/realtime"]`
	if got != want {
		t.Errorf("realtimeURL:\n got %s\nwant %s", got, want)
	}
}
