package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// TestBrowserConnection runs the web client in headless Chromium against
// the real program for what its connection costs and keeps: a user in many
// dialogs stays live, a signed-out session leaves nothing running, a
// reconnect lists the dialogs once, and the offline poll reads only what is
// new. Each subtest starts its own instances.
func TestBrowserConnection(t *testing.T) {
	b := startBrowser(t)
	t.Run("many dialogs stay live", func(t *testing.T) { browserManyDialogs(t, b) })
	t.Run("the open dialog is live past the subscription limit", func(t *testing.T) { browserOpenDialogPastTheLimit(t, b) })
	t.Run("a sign-in link opened in a running tab", func(t *testing.T) { browserSignInLinkInRunningTab(t, b) })
	t.Run("sign-out ends the old session", func(t *testing.T) { browserSignOutEndsSession(t, b) })
	t.Run("one listing per reconnect", func(t *testing.T) { browserOneListingPerReconnect(t, b) })
	t.Run("offline poll reads only new messages", func(t *testing.T) { browserOfflinePoll(t, b) })
}

const liveJS = `document.querySelector("#conn")?.dataset.phase === "live"`

// authLog records the Authorization header of every HTTP request a page
// sends (DevTools network events).
type authLog struct {
	mu   sync.Mutex // guards reqs
	reqs []string   // "<Authorization> <method> <url>"
}

// withToken lists "<method> <url>" of the requests sent with this bearer token.
func (l *authLog) withToken(tok string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if rest, ok := strings.CutPrefix(r, "Bearer "+tok+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// matching lists "GET <url>" of the GET requests whose URL contains substr.
func (l *authLog) matching(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if i := strings.Index(r, " GET "); i >= 0 && strings.Contains(r, substr) {
			out = append(out, r[i+1:])
		}
	}
	return out
}

func (l *authLog) reset() {
	l.mu.Lock()
	l.reqs = nil
	l.mu.Unlock()
}

// recordAuth starts recording; call it before the page loads.
func (p *page) recordAuth() *authLog {
	p.t.Helper()
	l := &authLog{}
	if err := chromedp.Listen(p.ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			l.mu.Lock()
			l.reqs = append(l.reqs, headerValue(e.Request.Headers, "Authorization")+" "+e.Request.Method+" "+e.Request.URL)
			l.mu.Unlock()
		}
	}); err != nil {
		p.t.Fatalf("%s: listen: %v", p.name, err)
	}
	p.do("enable network events", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{})
		return err
	}))
	return l
}

// count counts the frames received (or sent) that contain substr.
func (l *wsLog) count(sent bool, substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	frames := l.received
	if sent {
		frames = l.sent
	}
	n := 0
	for _, f := range frames {
		if strings.Contains(f, substr) {
			n++
		}
	}
	return n
}

// dialogsWith creates n dialogs of owner with member in PostgreSQL.
func dialogsWith(t *testing.T, m *Main, n int, owner, member string) []string {
	t.Helper()
	st := store.New(m.pg)
	ctx := context.Background()
	for _, u := range []string{owner, member} {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		d, err := st.CreateDialog(ctx, ids.New(), owner, fmt.Sprintf("d%d", i), []string{member})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d.ID)
	}
	return out
}

// browserManyDialogs: the client follows every listed dialog. bob is in
// 120; the server closes a socket beyond a burst of 60 frames (then 20/s)
// with 1008 "frame rate", so the SDK paces its subscribes. bob is live with
// every dialog subscribed, and again after his instance restarted (the
// resubscribe after hello).
func browserManyDialogs(t *testing.T, b *browser) {
	const dialogs = 120
	port := freePorts(t, 1)[0]
	vars := instanceVars(port, "browser-many", fmt.Sprintf("http://127.0.0.1:%d", port))
	m := start(t, vars)
	bob := ids.New()
	dialogsWith(t, m, dialogs, ids.New(), bob)
	bp := b.newPage(t, "bob")
	frames := bp.recordWebSocket()
	bp.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintToken(t, bob)))
	bp.confirmLinkSignIn()
	bp.waitJS(deliveryBound, "all dialogs listed", fmt.Sprintf(`document.querySelectorAll("a.dialog-item").length === %d`, dialogs))
	subscribedAll := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for frames.count(false, `"type":"subscribed"`) < want && time.Now().Before(deadline) && !frames.has(false, `"type":"error"`) {
			time.Sleep(100 * time.Millisecond)
		}
		if n := frames.count(false, `"type":"subscribed"`); n < want {
			t.Fatalf("%s: %d subscribed frames, want %d; banner %q", what, n, want, bp.text("#conn"))
		}
		time.Sleep(time.Second)
		if phase := mustEval[string](bp, `document.querySelector("#conn").dataset.phase`); phase != "live" {
			t.Fatalf("%s: bob, in %d dialogs, is not live: banner %q (phase %s)", what, dialogs, bp.text("#conn"), phase)
		}
	}
	subscribedAll("first connection", dialogs)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = start(t, vars)
	bp.waitJS(40*time.Second, "bob live again", liveJS)
	subscribedAll("after the restart", 2*dialogs)
	if frames.has(false, `"type":"error"`) {
		t.Errorf("error frames: %v", frames.received)
	}
	bp.noJSErrors()
}

// browserOpenDialogPastTheLimit: bob is in 201 dialogs; the socket follows
// 200 (the SDK's limit), the newest in the listing. Opening the oldest makes
// room for it (the least recently active followed dialog is dropped), so a
// message sent to it reaches the open window over the socket at once, and
// so does one sent to a dialog created after the limit was reached, once
// opened.
func browserOpenDialogPastTheLimit(t *testing.T, b *browser) {
	const dialogs = 201
	port := freePorts(t, 1)[0]
	vars := instanceVars(port, "browser-limit", fmt.Sprintf("http://127.0.0.1:%d", port))
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	dlgIDs := dialogsWith(t, m, dialogs, alice, bob)
	aTok := mintToken(t, alice)
	bp := b.newPage(t, "bob")
	frames := bp.recordWebSocket()
	bp.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintToken(t, bob)))
	bp.confirmLinkSignIn()
	bp.waitJS(deliveryBound, "all dialogs listed", fmt.Sprintf(`document.querySelectorAll("a.dialog-item").length === %d`, dialogs))
	deadline := time.Now().Add(30 * time.Second)
	for frames.count(false, `"type":"subscribed"`) < 200 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := frames.count(false, `"type":"subscribed"`); n != 200 {
		t.Fatalf("%d subscribed frames, want the limit of 200", n)
	}
	send := func(id, body string) {
		t.Helper()
		if code, b := callH(t, "POST", m.URL()+"/v1/dialogs/"+id+"/messages", aTok, fmt.Sprintf(`{"body":%q}`, body),
			map[string]string{"Idempotency-Key": ids.New()}); code != 201 {
			t.Fatalf("send: %d %s", code, b)
		}
	}
	oldest := dlgIDs[0] // last in the listing: not followed
	bp.do("open the oldest dialog", chromedp.Navigate(m.URL()+"/#/chat/"+oldest))
	bp.waitJS(deliveryBound, "dialog open", `document.querySelector("#dialog-title")?.textContent === "d0"`)
	deadline = time.Now().Add(deliveryBound)
	for !frames.has(false, `"type":"subscribed","dialogId":"`+oldest+`"`) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !frames.has(false, `"type":"subscribed","dialogId":"`+oldest+`"`) {
		t.Fatal("opening a dialog past the limit did not subscribe it")
	}
	send(oldest, "to the oldest")
	bp.waitSel(2*time.Second, "the message shown over the socket (the offline poll would take 5 s)", `#messages li.msg[data-seq="1"]`)
	if frames.has(false, `"type":"error"`) {
		t.Errorf("error frames: %v", frames.received)
	}
	bp.noJSErrors()
}

// browserSignInLinkInRunningTab: a sign-in link opened in a tab that runs
// already (a same-document navigation: only hashchange fires) — of another
// user over a running session, which asks first and switches once told to,
// and after a sign-out, which asks to sign in as a fresh page does — and
// its token leaves the address bar at once, as on a fresh page.
func browserSignInLinkInRunningTab(t *testing.T, b *browser) {
	port := freePorts(t, 1)[0]
	m := start(t, instanceVars(port, "browser-link", fmt.Sprintf("http://127.0.0.1:%d", port)))
	alice, bob := ids.New(), ids.New()
	p := b.newPage(t, "alice")
	p.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintToken(t, alice)))
	p.confirmLinkSignIn()
	p.waitJS(deliveryBound, "alice live", liveJS)
	signedInAs := func(what, user string) {
		t.Helper()
		p.waitJS(deliveryBound, what, fmt.Sprintf(`document.querySelector("#me-id")?.textContent === %q && document.querySelector("#conn")?.dataset.phase === "live"`, user[len(user)-8:]))
		if href := mustEval[string](p, "location.href"); strings.Contains(href, "token=") {
			t.Fatalf("%s: the token stayed in the address bar: %s", what, href)
		}
	}
	_ = mustEval[bool](p, fmt.Sprintf(`(() => { location.hash = "#token=%s"; return true; })()`, mintToken(t, bob)))
	p.waitSel(deliveryBound, "the switch question", "#switch-user")
	signedInAs("alice's session while asked", alice)
	p.click("#switch-go")
	signedInAs("bob's link over alice's session", bob)
	p.click("#sign-out")
	p.waitSel(deliveryBound, "sign-in form", "#signin-form")
	_ = mustEval[bool](p, fmt.Sprintf(`(() => { location.hash = "#token=%s"; return true; })()`, mintToken(t, alice)))
	p.confirmLinkSignIn()
	signedInAs("alice's link after the sign-out", alice)
	p.noJSErrors()
}

// browserSignOutEndsSession: alice signs out and in again in the same tab.
// Nothing of the first session keeps running: when the tab becomes visible
// again no request carries the signed-out token, and that token being dead
// by then does not sign out the new session.
func browserSignOutEndsSession(t *testing.T, b *browser) {
	port := freePorts(t, 1)[0]
	m := start(t, instanceVars(port, "browser-signout", fmt.Sprintf("http://127.0.0.1:%d", port)))
	alice := ids.New()
	signedIn := `!document.querySelector("#me").hidden && !document.querySelector("#signin-form")`

	// Her first token's exp passed 25 s ago: the server accepts it for ~5 s more.
	oldTok := mintTTL(t, alice, -25*time.Second)
	oldDead := time.Now().Add(-25 * time.Second).Truncate(time.Second).Add(serverLeeway)
	p := b.newPage(t, "alice")
	log := p.recordAuth()
	p.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+oldTok))
	p.confirmLinkSignIn()
	p.waitJS(deliveryBound, "alice live", liveJS)

	p.click("#sign-out")
	p.waitSel(deliveryBound, "sign-in form", "#signin-form")
	newTok := mintToken(t, alice)
	p.setValue("#token", newTok)
	p.click("#signin-btn")
	p.waitJS(deliveryBound, "alice live with the new token", liveJS+" && "+signedIn)

	time.Sleep(time.Until(oldDead.Add(2 * time.Second)))
	if code, _ := call(t, "GET", m.URL()+"/v1/me", oldTok, ""); code != 401 {
		t.Fatalf("the old token is still accepted (%d)", code)
	}
	log.reset()
	// She switches to another tab and back.
	_ = mustEval[bool](p, `(() => { document.dispatchEvent(new Event("visibilitychange")); return true; })()`)
	deadline := time.Now().Add(deliveryBound)
	for len(log.withToken(newTok)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if used := log.withToken(oldTok); len(used) > 0 {
		t.Errorf("after sign-out the page still sent the signed-out token:\n  %s", strings.Join(used, "\n  "))
	}
	if len(log.withToken(newTok)) == 0 {
		t.Errorf("the tab becoming visible listed nothing with the current token")
	}
	if !mustEval[bool](p, signedIn) {
		t.Fatalf("the current session was signed out; the page shows %q", p.text("#signin-error"))
	}
	if !mustEval[bool](p, liveJS) {
		t.Errorf("not live: %q", p.text("#conn"))
	}
	p.noJSErrors()
}

// browserOneListingPerReconnect: after a reconnect the server answers each
// dialog it cannot replay with a resync of its own (then subscribed
// recovered:false, which the SDK reconciles for that dialog). The dialog
// list is read once for the reconnect, not once per such resync, and every
// dialog's missed messages still arrive.
func browserOneListingPerReconnect(t *testing.T, b *browser) {
	const dialogs = 12
	ports := freePorts(t, 2)
	origins := fmt.Sprintf("http://127.0.0.1:%d,http://127.0.0.1:%d", ports[0], ports[1])
	varsX := instanceVars(ports[0], "browser-relist-x", origins)
	varsY := instanceVars(ports[1], "browser-relist-y", origins)
	// Replay at most one missed event per dialog: two missed give a resync.
	varsX["HAN_WS_RECOVER_MAX"] = "1"
	varsY["HAN_WS_RECOVER_MAX"] = "1"
	mx := start(t, varsX)
	my := start(t, varsY)
	alice, bob := ids.New(), ids.New()
	aTok, bTok := mintToken(t, alice), mintToken(t, bob)
	if code, body := call(t, "GET", mx.URL()+"/v1/me", bTok, ""); code != 200 {
		t.Fatalf("GET /v1/me for bob: %d %s", code, body)
	}
	var dlgIDs []string
	for i := 0; i < dialogs; i++ {
		code, body := callH(t, "POST", mx.URL()+"/v1/dialogs", aTok, fmt.Sprintf(`{"memberIds":[%q],"title":"d%d"}`, bob, i),
			map[string]string{"Idempotency-Key": ids.New()})
		if code != 201 {
			t.Fatalf("create dialog: %d %s", code, body)
		}
		var d struct{ ID string }
		_ = json.Unmarshal([]byte(body), &d)
		dlgIDs = append(dlgIDs, d.ID)
	}

	bp := b.newPage(t, "bob")
	frames := bp.recordWebSocket()
	log := bp.recordAuth()
	bp.do("open sign-in link", chromedp.Navigate(my.URL()+"/#token="+bTok))
	bp.confirmLinkSignIn()
	bp.waitJS(deliveryBound, "bob live", liveJS)
	bp.waitJS(deliveryBound, "all dialogs listed", fmt.Sprintf(`document.querySelectorAll("a.dialog-item").length === %d`, dialogs))
	deadline := time.Now().Add(deliveryBound)
	for frames.count(false, `"type":"subscribed"`) < dialogs && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := frames.count(false, `"type":"subscribed"`); n < dialogs {
		t.Fatalf("only %d subscribed frames", n)
	}

	// Bob's instance goes away; two messages per dialog are sent meanwhile.
	if err := my.Close(); err != nil {
		t.Fatalf("stop Y: %v", err)
	}
	for _, id := range dlgIDs {
		for j := 0; j < 2; j++ {
			if code, body := callH(t, "POST", mx.URL()+"/v1/dialogs/"+id+"/messages", aTok, fmt.Sprintf(`{"body":"away %d"}`, j),
				map[string]string{"Idempotency-Key": ids.New()}); code != 201 {
				t.Fatalf("send: %d %s", code, body)
			}
		}
	}
	listings := func() int { return len(log.matching("/v1/dialogs?")) }
	before := listings()
	_ = start(t, varsY)
	bp.waitJS(40*time.Second, "bob live again", liveJS)
	deadline = time.Now().Add(deliveryBound)
	for frames.count(false, `"recovery_unavailable"`) < dialogs && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := frames.count(false, `"recovery_unavailable"`); n < dialogs {
		t.Fatalf("%d resync recovery_unavailable frames, want %d", n, dialogs)
	}
	bp.waitJS(deliveryBound, "every dialog's missed messages (unread badges of 2)",
		fmt.Sprintf(`Array.from(document.querySelectorAll("a.dialog-item .badge")).filter((b) => b.textContent === "2").length === %d`, dialogs))
	time.Sleep(1500 * time.Millisecond)
	if n := listings() - before; n != 1 {
		t.Fatalf("the reconnect read the dialog list %d times for %d dialog resyncs, want once", n, dialogs)
	}
	bp.noJSErrors()
}

// browserOfflinePoll: while the socket is not live the open dialog polls
// REST every 5 s. Each poll reads after what the page already holds: once
// 250 missed messages are shown, the following polls read one short page
// each, not the backlog again.
func browserOfflinePoll(t *testing.T, b *browser) {
	port := freePorts(t, 1)[0]
	vars := instanceVars(port, "browser-poll", fmt.Sprintf("http://127.0.0.1:%d", port))
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	d := dialogsWith(t, m, 1, alice, bob)[0]
	bp := b.newPage(t, "bob")
	log := bp.recordAuth()
	bp.do("open sign-in link", chromedp.Navigate(m.URL()+"/#token="+mintToken(t, bob)))
	bp.confirmLinkSignIn()
	bp.waitJS(deliveryBound, "bob live", liveJS)
	bp.do("open dialog", chromedp.Navigate(m.URL()+"/#/chat/"+d))
	bp.waitJS(deliveryBound, "dialog open", `document.querySelector("#dialog-title")?.textContent === "d0"`)

	// Bob's socket goes and cannot come back (his ticket requests fail);
	// REST still works.
	stop := bp.intercept("*/v1/realtime/tickets*", fetch.RequestStageRequest, func(*fetch.EventRequestPaused) bool { return true })
	defer stop()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = start(t, vars)
	bp.waitJS(deliveryBound, "bob not live", `document.querySelector("#conn")?.dataset.phase !== "live"`)
	ctx := context.Background()
	for i := 1; i <= 250; i++ {
		if _, _, _, err := store.New(m.pg).SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d, SenderID: alice, Body: fmt.Sprintf("m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	bp.waitSel(12*time.Second, "message 250 shown by the offline poll", `#messages li.msg[data-seq="250"]`)
	if got := messagesShown(bp); len(got) != 250 {
		t.Fatalf("%d messages shown, want 250", len(got))
	}
	log.reset()
	time.Sleep(11 * time.Second) // two more polls
	reads := log.matching("/v1/dialogs/" + d + "/messages")
	t.Logf("history reads in 11 s after everything was shown:\n  %s", strings.Join(reads, "\n  "))
	if len(reads) < 1 || len(reads) > 3 {
		t.Fatalf("%d history reads in 11 s of polling every 5 s, want one per poll", len(reads))
	}
	for _, r := range reads {
		if !strings.Contains(r, "afterSeq=250") {
			t.Errorf("a poll read %s, want afterSeq=250 (what the page holds)", r)
		}
	}
	bp.noJSErrors()
}
