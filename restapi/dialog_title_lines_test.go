package restapi_test

import (
	"fmt"
	"testing"
)

// A dialog title is one line. The line and paragraph separators (U+2028,
// U+2029) break it where it is shown as LF does, so they are refused
// wherever they sit, like the control characters; at the ends they were
// trimmed away as white space, inside they were kept.
func TestDialogTitleRefusesLineAndParagraphSeparators(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	for _, title := range []string{
		"Team chat\u2028Official support", "Team\u2029chat", "\u2028Team chat", "Team chat\u2029",
	} {
		code, b := h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":%q}`, bob, title))
		if code != 400 || string(b) != `{"error":"invalid_title"}` {
			t.Errorf("title %+q: %d %s, want 400 invalid_title", title, code, b)
		}
	}
	// Other white space inside a title is kept, and trimmed at its ends.
	code, b := h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":" Team\u00a0chat\u3000 "}`, bob))
	if code != 201 || decode[dialogResp](t, b).Title != "Team\u00a0chat" {
		t.Fatalf("title with other white space: %d %s", code, b)
	}
}
