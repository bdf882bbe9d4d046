package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
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

// typeInto types text into the element sel matches, as keystrokes.
func typeInto(t *testing.T, ctx context.Context, sel, text string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.SendKeys(chromedp.CSS(sel), text, chromedp.NodeVisible)); err != nil {
		t.Fatalf("type into %s: %v", sel, err)
	}
}

func jsInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// Text is laid out in its own direction: a Hebrew message, title and
// list preview read right to left (the closing "!" of "שלום, עולם!" at the
// left end, where an RTL reader ends the sentence), English left to right;
// the composer takes the direction of what is typed into it.
func TestTextShowsInItsOwnDirection(t *testing.T) {
	ctx := startChromium(t)
	for _, c := range []struct{ title, body, dir string }{
		{"שיחה", "שלום, עולם!", "rtl"},
		{"Team", "Hello, world!", "ltr"},
	} {
		a := newUsersAPI(c.title, c.body)
		srv := a.serve(t)
		signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
		typeInto(t, ctx, "#composer-input", c.body)
		got := evalJS[string](t, ctx, `(() => {
			const dir = (...sels) => getComputedStyle(sels.map((s) => document.querySelector(s)).find(Boolean)).direction;
			const p = document.querySelector('#messages li.msg .body');
			const text = p.firstChild, n = text.data.length;
			const x = (i) => { const r = document.createRange(); r.setStart(text, i); r.setEnd(text, i + 1); return r.getBoundingClientRect().left; };
			return JSON.stringify({body: dir('#messages li.msg .body'), title: dir('#dialog-title'), listed: dir('.dialog-name'),
				preview: dir('.dialog-sub bdi', '.dialog-sub'), composer: dir('#composer-input'), typed: document.querySelector('#composer-input').value,
				endLeftOfStart: x(n - 1) < x(0)});
		})()`)
		var res struct {
			Body, Title, Listed, Preview, Composer, Typed string
			EndLeftOfStart                                bool
		}
		if err := json.Unmarshal([]byte(got), &res); err != nil {
			t.Fatalf("%v: %s", err, got)
		}
		want := struct {
			Body, Title, Listed, Preview, Composer, Typed string
			EndLeftOfStart                                bool
		}{c.dir, c.dir, c.dir, c.dir, c.dir, c.body, c.dir == "rtl"}
		if res != want {
			t.Errorf("%q: directions %+v, want %+v", c.body, res, want)
		}
	}
}

// The composer holds 4000 characters as the server counts them (Unicode
// code points, utf8.RuneCount), not 4000 UTF-16 units: 4000 emoji fit,
// typed or pasted; what an edit brings past the limit is cut at it,
// without splitting a character. The new dialog's title holds 200 the
// same way.
func TestTheComposerCountsCharactersAsTheServerDoes(t *testing.T) {
	ctx := startChromium(t)
	a := newUsersAPI("Team", "hi")
	srv := a.serve(t)
	signInTab(t, ctx, srv.URL, a.token(aliceID, time.Hour), aliceDialogID)
	const emoji = "😀" // one character, two UTF-16 units
	// state: the field's length in characters and UTF-16 units, and its
	// last three characters.
	state := func(sel string) (chars, units int, end string) {
		t.Helper()
		got := evalJS[string](t, ctx, `(() => { const v = document.querySelector('`+sel+`').value;
			return JSON.stringify([[...v].length, v.length, [...v].slice(-3).join("")]); })()`)
		var r [3]any
		if err := json.Unmarshal([]byte(got), &r); err != nil {
			t.Fatalf("%v: %s", err, got)
		}
		return int(r[0].(float64)), int(r[1].(float64)), r[2].(string)
	}
	set := func(sel, v string) {
		evalJS[bool](t, ctx, `(document.querySelector('`+sel+`').value = `+jsString(v)+`, true)`)
	}

	for _, c := range []struct {
		what, before, typed string
		wantEnd             string
	}{
		{"typed after 3998 letters", strings.Repeat("a", 3998), emoji + emoji + emoji, "a" + emoji + emoji},
		{"typed after 3999 emoji", strings.Repeat(emoji, 3999), emoji + emoji, emoji + emoji + emoji},
		{"pasted into an empty composer", "", strings.Repeat(emoji, 4001), emoji + emoji + emoji},
	} {
		set("#composer-input", c.before)
		if strings.HasPrefix(c.what, "pasted") {
			insertText(t, ctx, "#composer-input", c.typed)
		} else {
			typeInto(t, ctx, "#composer-input", c.typed)
		}
		if chars, units, end := state("#composer-input"); chars != 4000 || end != c.wantEnd {
			t.Errorf("%s: the composer holds %d characters (%d UTF-16 units) ending %q, want 4000 ending %q", c.what, chars, units, end, c.wantEnd)
		}
	}

	// At the caret, in the middle: what was there stays, the insert is cut.
	set("#composer-input", strings.Repeat("a", 3998)+"Z")
	evalJS[bool](t, ctx, `(document.querySelector('#composer-input').setSelectionRange(1, 1), true)`)
	insertText(t, ctx, "#composer-input", emoji+emoji)
	got := evalJS[string](t, ctx, `(() => { const el = document.querySelector('#composer-input');
		return JSON.stringify([el.value === "a" + "`+emoji+`" + "a".repeat(3997) + "Z", el.selectionStart]); })()`)
	if got != "[true,3]" {
		t.Errorf("an insert in the middle: [value kept around one emoji, caret]: %s, want [true,3]", got)
	}

	evalJS[bool](t, ctx, `(document.querySelector('#new-dialog-box').open = true, true)`)
	insertText(t, ctx, "#new-title", strings.Repeat(emoji, 201))
	if chars, units, _ := state("#new-title"); chars != 200 {
		t.Errorf("the new dialog's title holds %d characters (%d UTF-16 units), want 200", chars, units)
	}
}

// insertText puts text into the focused element sel matches at once, as a
// paste or an input method does.
func insertText(t *testing.T, ctx context.Context, sel, text string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := chromedp.Do(c, chromedp.Focus(chromedp.CSS(sel), chromedp.NodeVisible),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: text})
			return err
		}))
	if err != nil {
		t.Fatalf("insert into %s: %v", sel, err)
	}
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
