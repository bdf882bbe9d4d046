package web_test

import (
	"fmt"
	"regexp"
	"testing"
	"time"
)

// serverLeeway is how long past a token's exp the server still takes it
// (then it closes the connection with 4001 token_expired).
const serverLeeway = 30 * time.Second

// awaitRefresh is the token of the next refresh frame, failing the test
// when none comes within timeout.
func awaitRefresh(t *testing.T, a *usersAPI, timeout time.Duration, what string) string {
	t.Helper()
	select {
	case tok := <-a.refreshes:
		return tok
	case <-time.After(timeout):
		t.Fatalf("no refresh frame: %s", what)
		return ""
	}
}

// A device whose clock is 10 min behind the server's still renews in
// time: the live connection asks for a new token about a minute before
// the credential's exp on the server's clock (the "New token needed" card
// says it expires within a minute, not in 11 min), long before the server
// would close it; the new token goes in band, and its expiry is shown on
// the device's clock.
func TestADeviceClockBehindTheServersRenewsBeforeTheTokenExpires(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	a.live = true
	a.skew = 10 * time.Minute
	srv := a.serve(t)
	tok := a.token(aliceID, 75*time.Second)
	a.mu.Lock()
	exp := a.exps[tok]
	a.mu.Unlock()
	signInTab(t, ctx, srv.URL, tok, aliceDialogID)
	close(a.helloGo)

	// The server refuses the token from exp + leeway (its clock); the card
	// must come well before exp, leaving the user time to answer it.
	waitJS(t, ctx, time.Until(exp.Add(-a.skew)), "the New token needed card before the token's exp on the server's clock",
		`document.querySelector('#renew')`)
	text := evalJS[string](t, ctx, `document.querySelector('#renew-text').textContent`)
	if !regexp.MustCompile(`^Your token expires in (\d+ s|1 min) `).MatchString(text) {
		t.Errorf("renew card says %q, want the token to expire within a minute", text)
	}
	if left := exp.Sub(a.now()); left < 0 {
		t.Fatalf("the card came %s after the token's exp on the server's clock", -left)
	}

	renewed := a.token(aliceID, 20*time.Minute)
	evalJS[bool](t, ctx, fmt.Sprintf(`(document.querySelector('#renew-token').value = %q, true)`, renewed))
	click(t, ctx, "#renew-btn")
	if got := awaitRefresh(t, a, 10*time.Second, "after the new token was given"); got != renewed {
		t.Errorf("refresh frame carried another token than the one pasted")
	}
	if left := exp.Add(serverLeeway).Sub(a.now()); left <= 0 {
		t.Errorf("the refresh came %s after the server would have closed the connection", -left)
	}
	waitJS(t, ctx, 10*time.Second, "the card gone and the connection live",
		`!document.querySelector('#renew') && document.querySelector('#conn').dataset.phase === "live"`)
	if title := evalJS[string](t, ctx, `document.querySelector('#me').title`); !regexp.MustCompile(`\(in (19|20) min\)$`).MatchString(title) {
		t.Errorf("user chip says %q, want the new token to expire in 20 min", title)
	}
}

// A device whose clock is 10 min ahead of the server's neither takes a
// token for expired while the server still takes it nor asks for one far
// from expiry: when the live connection's credential is due for renewal
// (a minute before its exp on the server's clock), the newer token a
// sign-in link gave the tab — 5 min left on the server's clock, 5 min past
// on the device's — is sent in band at once, without a "New token
// needed" card; after that nothing more is asked for.
func TestADeviceClockAheadOfTheServersDoesNotRenewEarly(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hello")
	a.live = true
	a.skew = -10 * time.Minute
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, 75*time.Second), aliceDialogID)
	select {
	case <-a.upgraded:
	case <-time.After(10 * time.Second):
		t.Fatal("no WebSocket")
	}
	linked := a.token(aliceID, 5*time.Minute)
	evalJS[bool](t, ctx, fmt.Sprintf(`(location.hash = "#token=%s", true)`, linked))
	waitJS(t, ctx, 10*time.Second, "the link's token in use", fmt.Sprintf(`sessionStorage.getItem("han.token") === %q`, linked))
	close(a.helloGo)

	if got := awaitRefresh(t, a, 60*time.Second, "the credential ending within a minute was not renewed"); got != linked {
		t.Errorf("refresh frame carried another token than the link's")
	}
	waitJS(t, ctx, 10*time.Second, "live", `document.querySelector('#conn').dataset.phase === "live"`)
	// A client going by the device's clock would take the new credential
	// for expired and ask again once the 10 s between asks have passed.
	time.Sleep(15 * time.Second)
	select {
	case <-a.refreshes:
		t.Error("a second refresh frame for a credential 5 min from expiry")
	default:
	}
	if evalJS[bool](t, ctx, `!!document.querySelector('#renew')`) {
		t.Errorf("New token needed card shown: %q", evalJS[string](t, ctx, `document.querySelector('#renew-text').textContent`))
	}
}
