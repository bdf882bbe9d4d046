package web_test

import (
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
)

// A new dialog whose creation failed without saying whether it was written
// (a 500: the commit's answer lost) and that the user submits again, the
// form unchanged, is sent with the same Idempotency-Key: the server
// answers it from the dialog already written instead of writing a second
// one. A changed form is another dialog, with a key of its own.
func TestCreatingADialogAgainAfterAFailureReusesItsKey(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hi")
	const newDialog = "00000000-0000-4000-8000-0000000d1a11"
	var keys []string
	written := map[string]bool{}
	a.createDialog = func(key string) (int, any) {
		keys = append(keys, key)
		first := len(written) == 0
		written[key] = true
		if first {
			return 500, map[string]any{"error": "internal"}
		}
		return 201, map[string]any{"id": newDialog, "title": "", "memberIds": []string{aliceID, otherMemberID},
			"lastSeq": 0, "createdAt": time.Now().UnixMilli()}
	}
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	submit := func(members string) {
		t.Helper()
		evalJS[bool](t, ctx, `(document.querySelector('#new-dialog-box').open = true,
			document.querySelector('#new-members').value = `+jsString(members)+`, true)`)
		click(t, ctx, "#new-dialog button[type=submit]")
	}
	tries := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(keys)
	}
	submit(otherMemberID)
	waitJS(t, ctx, 10*time.Second, "the failure", `document.querySelector('#new-dialog-error').textContent !== ""`)
	if n := tries(); n != 1 {
		t.Fatalf("%d create requests for one submit, want 1", n)
	}
	submit(otherMemberID)
	waitJS(t, ctx, 10*time.Second, "the new dialog opened", `location.hash === "#/chat/`+newDialog+`"`)
	a.mu.Lock()
	got := append([]string(nil), keys...)
	dialogs := len(written)
	a.mu.Unlock()
	if len(got) != 2 || got[0] == "" || got[1] != got[0] || dialogs != 1 {
		t.Errorf("keys of the two submits %q: %d dialogs written, want one key twice and one dialog", got, dialogs)
	}

	// Created: the same form submitted anew is a new dialog, with a new key.
	submit(otherMemberID)
	testenv.Eventually(t, 10*time.Second, func() bool { return tries() >= 3 }, "the third create request")
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(keys) != 3 || keys[2] == keys[0] {
		t.Errorf("keys %q: a dialog created anew after a success needs a new key", keys)
	}
}
