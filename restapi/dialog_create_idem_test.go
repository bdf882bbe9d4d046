package restapi_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// A dialog-create retry under the same key whose memberIds come in another
// order, repeat a member or list the creator is the same request: it
// replays the first answer (it got 409 idempotency_key_reused).
func TestDialogCreateRetryWithMembersReorderedIsAReplay(t *testing.T) {
	h := newHarness(t)
	me, aTok := h.user()
	bob, _ := h.user()
	carol, _ := h.user()
	key := keyHdr("dlg-order-" + ids.New())
	code, b1, _ := h.doH(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q,%q],"title":"t"}`, bob, carol), key)
	if code != 201 {
		t.Fatalf("create: %d %s", code, b1)
	}
	for _, members := range []string{
		fmt.Sprintf(`[%q,%q]`, carol, bob),
		fmt.Sprintf(`[%q,%q,%q]`, bob, carol, bob),
		fmt.Sprintf(`[%q,%q,%q]`, me, bob, carol),
	} {
		code, b2, hdr := h.doH(aTok, "POST", "/v1/dialogs", `{"memberIds":`+members+`,"title":"t"}`, key)
		if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry with memberIds %s: %d %s, want the replay of %s", members, code, b2, b1)
		}
	}
}

// The Idempotency-Key's syntax is checked before the body, as on the other
// keyed routes: a bad key with a bad body is 400 invalid_idempotency_key.
func TestDialogCreateKeySyntaxCheckedFirst(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	code, b, _ := h.doH(aTok, "POST", "/v1/dialogs", `{"memberIds":[]}`, keyHdr(strings.Repeat("k", 256)))
	wantError(t, code, b, 400, "invalid_idempotency_key")
}
