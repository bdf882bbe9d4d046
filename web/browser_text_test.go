package web_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// What members write, shown in the page: titles and bodies of any length
// and script, and the composer that takes them.

// A dialog title of 200 characters (the server's limit) without a space
// stays on one line inside the conversation header, cut with an ellipsis
// and whole in its tooltip: the page does not scroll sideways, on a
// desktop or a phone.
func TestALongUnbrokenTitleStaysInItsHeader(t *testing.T) {
	ctx := startChromium(t)
	title := strings.Repeat("W", 200)
	a := newUsersAPI(title, "hi")
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	for _, width := range []int64{1280, 390} {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, 860)); err != nil {
			t.Fatal(err)
		}
		waitJS(t, ctx, 5*time.Second, "the new width", `innerWidth === `+jsInt(width))
		got := evalJS[string](t, ctx, `(() => {
			const h = document.querySelector('#dialog-title'), head = h.closest('.conv-head');
			const r = h.getBoundingClientRect(), hr = head.getBoundingClientRect();
			return JSON.stringify({page: document.scrollingElement.scrollWidth, view: innerWidth,
				titleRight: Math.round(r.right), headRight: Math.round(hr.right),
				lines: Math.round(r.height / parseFloat(getComputedStyle(h).lineHeight)), tooltip: h.title});
		})()`)
		var res struct {
			Page, View, TitleRight, HeadRight, Lines int
			Tooltip                                  string
		}
		if err := json.Unmarshal([]byte(got), &res); err != nil {
			t.Fatalf("%v: %s", err, got)
		}
		if res.Page > res.View || res.TitleRight > res.HeadRight || res.Lines != 1 {
			t.Errorf("%d px: page %d px wide in a %d px view; title ends at %d px on %d line(s), its header at %d px",
				width, res.Page, res.View, res.TitleRight, res.Lines, res.HeadRight)
		}
		if res.Tooltip != title {
			t.Errorf("%d px: the title's tooltip is %q, want the whole title", width, res.Tooltip)
		}
	}
}

func jsInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
