package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
)

// A sign-in link opened in a signed-out tab — a fragment change in the
// tab showing the sign-in form, or a new load — does not sign in by
// itself: someone who sends the user a link with their own token would
// otherwise have the user chat as them, and read what the user writes.
// The tab names the link's user and asks, with Don't sign in focused;
// until the answer the token is used for GET /v1/me alone, kept nowhere,
// and gone from the address bar and the tab's history. Declining leaves
// the tab signed out, also after a reload; Sign in signs in as the link's
// user.
func TestASignInLinkInASignedOutTabAsksFirst(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	srv := a.serve(t)
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the sign-in form", `document.querySelector('#signin-form')`)
	mallory := a.token(malloryID, time.Hour)
	evalJS[bool](t, ctx, fmt.Sprintf(`(location.hash = "#token=%s", true)`, mallory))
	asked(t, ctx, a, malloryID)

	click(t, ctx, "#link-signin-no")
	waitJS(t, ctx, 5*time.Second, "the sign-in form again", `document.querySelector('#signin-form') && !document.querySelector('#link-signin')`)
	signedOut := func(when string) {
		t.Helper()
		got := evalJS[string](t, ctx, `[location.href.includes("token="), sessionStorage.getItem("han.token")].join(" ")`)
		if who := signedInAs(t, ctx); who != "(signed out)" || got != "false " {
			t.Errorf("%s: signed in as %s; token in the address, token stored: %q, want signed out, \"false \"", when, who, got)
		}
	}
	signedOut("after Don't sign in")
	// Back and Forward walk the tab's history: no entry holds the token.
	for _, step := range []string{"history.back()", "history.forward()"} {
		before := evalJS[string](t, ctx, `location.href`)
		evalJS[bool](t, ctx, "("+step+", true)")
		waitJS(t, ctx, 5*time.Second, step, fmt.Sprintf(`location.href !== %q`, before))
		if href := evalJS[string](t, ctx, `location.href`); strings.Contains(href, "token=") {
			t.Errorf("after %s the address holds the token: %s", step, href)
		}
	}
	if err := chromedp.Do(c, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the sign-in form after a reload", `document.querySelector('#signin-form')`)
	signedOut("after a reload")
	if calls := a.callsOf(malloryID); len(calls) != 1 || calls[0] != "/v1/me" {
		t.Errorf("declined link's token was used for %v, want GET /v1/me once", calls)
	}

	// A new load of alice's link: asked; Sign in signs her in.
	alice := a.token(aliceID, time.Hour)
	if err := chromedp.Do(c, chromedp.Navigate(srv.URL+"/?again#token="+alice)); err != nil {
		t.Fatal(err)
	}
	asked(t, ctx, a, aliceID)
	click(t, ctx, "#link-signin-go")
	waitJS(t, ctx, 10*time.Second, "alice signed in", fmt.Sprintf(`document.querySelector('#me-id').title === %q &&
		document.querySelector('[data-dialog=%q]') && !document.querySelector('#link-signin')`, aliceID, aliceDialogID))
	if got := evalJS[string](t, ctx, `sessionStorage.getItem("han.token")`); got != alice {
		t.Errorf("after Sign in the tab keeps %q, want alice's token", got)
	}
	if href := evalJS[string](t, ctx, `location.href`); strings.Contains(href, "token=") {
		t.Errorf("the token stayed in the address bar: %s", href)
	}
}

// asked waits for the question a sign-in link asks in a signed-out tab
// and checks it names user, with Don't sign in focused, while the tab is
// signed out, keeps no token and shows none in its address.
func asked(t *testing.T, ctx context.Context, a *usersAPI, user string) {
	t.Helper()
	waitJS(t, ctx, 10*time.Second, "the sign-in question (or a sign-in)",
		`document.querySelector('#link-signin') || (!document.querySelector('#me').hidden && document.querySelector('#me-id').title)`)
	if who := signedInAs(t, ctx); who != "(signed out)" {
		t.Fatalf("the link signed the tab in as %s without asking", who)
	}
	got := evalJS[string](t, ctx, `JSON.stringify({user: document.querySelector('#link-signin').dataset.user,
		question: document.querySelector('#link-signin-title').textContent, text: document.querySelector('#link-signin-text').textContent,
		focused: document.activeElement.id, href: location.href, stored: sessionStorage.getItem("han.token")})`)
	var q struct {
		User, Question, Text, Focused, Href string
		Stored                              *string
	}
	if err := json.Unmarshal([]byte(got), &q); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	if q.User != user || q.Question != "Sign in as user "+user[len(user)-8:]+"?" || !strings.Contains(q.Text, user) || q.Focused != "link-signin-no" {
		t.Errorf("question %q (%q) for user %s, focus on #%s; want it to name %s, Don't sign in focused", q.Question, q.Text, q.User, q.Focused, user)
	}
	if q.Stored != nil || strings.Contains(q.Href, "token=") {
		t.Errorf("while asked: token stored %v, address %s; want none kept and none in the address", q.Stored != nil, q.Href)
	}
	for _, p := range a.callsOf(user) {
		if p != "/v1/me" {
			t.Errorf("while asked the link's token was used for %s", p)
		}
	}
}

// A sign-in link of another user opened in a signed-in tab — by a page
// that can navigate the tab, as a fragment navigation (only hashchange
// fires) or a new load (the tab's session is in sessionStorage) — does
// not end the session: the tab asks "Switch to user …?", showing what it
// showed, with Stay focused. Stay keeps the session; Switch user signs in
// as the link's user.
func TestASignInLinkOfAnotherUserAsksFirst(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	srv := a.serve(t)
	alice := a.token(aliceID, time.Hour)
	signInTab(t, ctx, srv.URL, alice, aliceDialogID)
	mallory := a.token(malloryID, time.Hour)

	evalJS[bool](t, ctx, fmt.Sprintf(`(location.hash = "#token=%s", true)`, mallory))
	waitJS(t, ctx, 10*time.Second, "the switch question", `document.querySelector('#switch-user')`)
	got := evalJS[string](t, ctx, `JSON.stringify({user: document.querySelector('#switch-user').dataset.user,
		question: document.querySelector('#switch-title').textContent, focused: document.activeElement.id, hash: location.hash,
		shown: document.querySelectorAll('#messages li.msg').length, stored: sessionStorage.getItem("han.token")})`)
	var q struct {
		User, Question, Focused, Hash, Stored string
		Shown                                 int
	}
	if err := json.Unmarshal([]byte(got), &q); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	if who := signedInAs(t, ctx); who != aliceID || q.Stored != alice {
		t.Errorf("while the question is open the tab is signed in as %s (stored token is alice's: %v), want alice still", who, q.Stored == alice)
	}
	if q.User != malloryID || q.Question != "Switch to user "+malloryID[len(malloryID)-8:]+"?" || q.Focused != "switch-stay" {
		t.Errorf("question %q for user %s, focus on #%s; want it to name mallory, Stay focused", q.Question, q.User, q.Focused)
	}
	if q.Hash != "#/chat/"+aliceDialogID || q.Shown != 1 {
		t.Errorf("the tab moved: address %q, %d messages shown; want alice's dialog as before the link", q.Hash, q.Shown)
	}
	click(t, ctx, "#switch-stay")
	waitJS(t, ctx, 5*time.Second, "the question to go", `!document.querySelector('#switch-user')`)
	if who := signedInAs(t, ctx); who != aliceID {
		t.Errorf("after Stay the tab is signed in as %s, want alice", who)
	}

	// The same link loaded anew in the tab: alice's session comes back first.
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(srv.URL+"/?again#token="+mallory)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the switch question after a load", `document.querySelector('#switch-user') && document.querySelector('#me-id').title`)
	if who := signedInAs(t, ctx); who != aliceID {
		t.Errorf("a load of mallory's link in alice's tab signed in as %s before she answered", who)
	}
	click(t, ctx, "#switch-go")
	waitJS(t, ctx, 10*time.Second, "mallory signed in", fmt.Sprintf(`document.querySelector('#me-id').title === %q &&
		document.querySelector('[data-dialog=%q]') && !document.querySelector('#switch-user')`, malloryID, malloryDialog))
	if s := evalJS[string](t, ctx, `location.href`); strings.Contains(s, "token=") {
		t.Errorf("the token stayed in the address bar: %s", s)
	}
}

// A sign-in link whose token the server refuses, opened in a signed-in
// tab, is reported and changes nothing: the session, the token it uses
// and the dialog on screen stay.
func TestARefusedSignInLinkKeepsTheSession(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	srv := a.serve(t)
	alice := a.token(aliceID, time.Hour)
	signInTab(t, ctx, srv.URL, alice, aliceDialogID)

	evalJS[bool](t, ctx, `(location.hash = "#token=bogus", true)`)
	waitJS(t, ctx, 10*time.Second, "the refusal", `document.querySelector('.toast-error .link-refused[data-code="unauthorized"]')`)
	if who := signedInAs(t, ctx); who != aliceID {
		t.Errorf("after a refused link the tab shows %s, want alice's session kept", who)
	}
	got := evalJS[string](t, ctx, `[location.hash, document.querySelectorAll('#messages li.msg').length, sessionStorage.getItem("han.token") === `+
		fmt.Sprintf("%q", alice)+`, !!document.querySelector('#switch-user')].join(" ")`)
	if want := "#/chat/" + aliceDialogID + " 1 true false"; got != want {
		t.Errorf("address, messages shown, token kept, question: %q, want %q", got, want)
	}
	// The session's requests still go with alice's token.
	click(t, ctx, "#refresh-dialogs")
	waitJS(t, ctx, 5*time.Second, "the list refreshed", fmt.Sprintf(`document.querySelector('[data-dialog=%q]')`, aliceDialogID))
	if who := signedInAs(t, ctx); who != aliceID {
		t.Errorf("after a refresh the tab shows %s", who)
	}
}

// A sign-in link of the signed-in user renews the session without a
// question: requests use its token, and when the live connection asks for
// a token (its credential ends within a minute) it is given the link's at
// once, in band on the same connection — no "New token needed" card, no
// new session.
func TestASignInLinkOfTheSameUserRenewsTheSession(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	a.live = true
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, 30*time.Second), aliceDialogID)
	select {
	case <-a.upgraded:
	case <-time.After(10 * time.Second):
		t.Fatal("no WebSocket")
	}
	renewed := a.token(aliceID, 2*time.Hour)
	evalJS[bool](t, ctx, fmt.Sprintf(`(location.hash = "#token=%s", true)`, renewed))
	waitJS(t, ctx, 10*time.Second, "the link's token in use", fmt.Sprintf(`sessionStorage.getItem("han.token") === %q`, renewed))

	close(a.helloGo) // hello: the connection's credential (the first token) ends in 30 s
	select {
	case tok := <-a.refreshes:
		if tok != renewed {
			t.Errorf("refresh frame carried another token than the link's")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the live connection was not given the link's token (no refresh frame)")
	}
	waitJS(t, ctx, 10*time.Second, "live", `document.querySelector('#conn').dataset.phase === "live"`)
	got := evalJS[string](t, ctx, `[!!document.querySelector('#renew'), !!document.querySelector('#switch-user'), location.hash,
		document.querySelectorAll('#messages li.msg').length].join(" ")`)
	if want := "false false #/chat/" + aliceDialogID + " 1"; got != want {
		t.Errorf("renew card, switch question, address, messages: %q, want %q", got, want)
	}
	a.mu.Lock()
	tickets := a.tickets
	a.mu.Unlock()
	if who := signedInAs(t, ctx); who != aliceID || tickets != 1 {
		t.Errorf("signed in as %s after %d ticket requests, want alice on her first connection", who, tickets)
	}
}

// The client is served with Cross-Origin-Opener-Policy: same-origin: a
// page of another origin that opens it holds no reference to it
// afterwards (and the client none to that page), so it cannot navigate
// the signed-in tab, to a sign-in link or anywhere.
func TestAnotherOriginHoldsNoReferenceToTheTab(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	srv := a.serve(t)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<!doctype html><title>other</title><p>hi</p>"))
	}))
	defer evil.Close()
	if err := chromedp.Do(ctx, chromedp.Navigate(strings.Replace(evil.URL, "127.0.0.1", "localhost", 1))); err != nil {
		t.Fatal(err)
	}
	opened := chromedp.WaitNewTarget(ctx, func(i *target.Info) bool { return strings.HasPrefix(i.URL, srv.URL) })
	gesture := func(p *runtime.EvaluateParams) { yes := true; p.UserGesture = &yes }
	link := srv.URL + "/#token=" + a.token(aliceID, time.Hour)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(window.w = window.open(%q, "han"), true)`, link), gesture)); err != nil {
		t.Fatal(err)
	}
	var id target.ID
	select {
	case id = <-opened:
	case <-time.After(10 * time.Second):
		t.Fatal("the tab did not open")
	}
	han, cancel := chromedp.NewContext(ctx, chromedp.WithTargetID(id))
	defer cancel()
	if err := chromedp.Do(han); err != nil {
		t.Fatalf("attach: %v", err)
	}
	confirmLinkSignIn(t, han)
	waitJS(t, han, 10*time.Second, "alice signed in", fmt.Sprintf(`document.querySelector('#me-id') && document.querySelector('#me-id').title === %q`, aliceID))
	if !evalJS[bool](t, ctx, `w.closed`) {
		t.Error("the opener of another origin still holds a live reference to the signed-in tab")
	}
	if !evalJS[bool](t, han, `window.opener === null`) {
		t.Error("the signed-in tab still holds a reference to its opener of another origin")
	}
}
